"""The audit service: ``circuitstat serve``, a thin, durable HTTP front over the CLI's own code.

A job is a spec plus an owner; running it calls what the CLI command calls, its run kind's declaration
(``circuitstat.pipelines.kinds``: :func:`circuitstat.pipelines.runs.audit.run.run_audit`, the study runners,
:func:`circuitstat.pipelines.runs.attribute.run.run_attribute`), in a worker, writing a run directory under the data
directory. Nothing here computes statistics.

Modules (one idea each):

* ``config``     the operator's settings: data dir, database URL, scheduler, workers, quotas, allow-list
* ``sources``    the model-source allow-list (zoo recipes, named local models, ``random:``)
* ``db``         SQLAlchemy tables and sessions; ``migrations/`` their Alembic history
* ``accounts``   users, bearer tokens (hashes at rest, constant-time checks) and browser sessions
* ``submission`` turning an uploaded spec and task files into a validated job
* ``pricing``    what a job costs (models, parameters, memory), priced from its spec at submission, torch-free
* ``queue``      job states and leases (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL)
* ``runner``     what a worker runs for one job (the CLI's functions), in the job's inputs directory
* ``progress``   a running job's stage, progress (stages and their work units) and ETA
* ``pools``      where jobs run: a local pool of worker processes, or a Dask cluster
* ``dispatcher`` the loop that claims jobs, renews leases, collects outcomes and drains on SIGTERM
* ``quotas``     per-user limits: active jobs, request size, request rate (estimated work: ``runner``;
  model sizes: ``pricing``; wall time: ``dispatcher``)
* ``problems``   ``application/problem+json`` errors
* ``access``     which jobs a user may see (own, shared, public) and the 404 for every other
* ``api``        the JSON API under ``/api/v1``; ``api_runs`` its endpoints over a finished run
* ``pages``      the server-rendered pages (Jinja2 templates in ``templates/``, no JavaScript)
* ``metrics``    ``/metrics`` in Prometheus text format
* ``logs``       structured JSON logs with every token redacted
* ``app``        the FastAPI application; ``server`` runs it under uvicorn
* ``client``     ``circuitstat submit --server`` and ``circuitstat check --server``
"""
