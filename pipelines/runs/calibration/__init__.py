"""The ``study calibration`` run kind: do the audit's intervals cover on this model and task, at this N?"""
