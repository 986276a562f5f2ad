"""Failure data: reading a user's failure log, fitting lifetime models to it by censored
maximum likelihood, and the two real records that ship with ckptsim (Titan, LANL).
"""
