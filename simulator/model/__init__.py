"""The model's inputs: a scenario (one job on one cluster), its failure models and sources,
its checkpoint tiers and failure classes, what a save costs in time and what time costs
in money.
"""
