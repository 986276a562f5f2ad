"""ckptsim: how often to checkpoint large-scale GPU training, and what failures cost.

The simulation core (failures, analytic, policies, des, optimize) never imports torch, so
``import simulator`` stays fast; the benchmark (``simulator.bench``) and the live-training
controller (``simulator.controller``) do.
"""

__version__ = "0.1.0"
