"""One package per run kind (circuitstat.pipelines.kinds names each): its spec reading, run, stages and
pricing, and the ``KIND`` record. Infrastructure shared by kinds stays in circuitstat.pipelines."""
