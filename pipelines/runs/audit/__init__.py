"""The ``audit`` run kind: attribution, intervals, stability, faithfulness, approximation and heads in one run."""
