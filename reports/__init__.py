"""circuitstat's report layer (``circuitstat.reports``): the HTML report and the verdicts, rendered from run tables.

``circuitstat.reports.html`` renders a run directory into one self-contained page and
``circuitstat.reports.verdicts`` writes the verdict lines the terminal summary and the page share; both
read the tables through ``circuitstat.reports.tableset`` and print each interval from the row it
came from (``circuitstat.reports.ci``). Reads tables only: it imports the foundation
(``circuitstat.core``) and nothing of circuits/, stats/ or pipelines/, and never torch.
"""
