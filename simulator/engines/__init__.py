"""The simulation engines and what they share: the SimPy discrete-event model (the
reference), the vectorised fast engine, the rule that picks one, the replica streams, the
record schema, the work budget and the worker pool.
"""
