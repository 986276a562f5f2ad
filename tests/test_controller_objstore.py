"""Checkpoints on object storage: a real S3-compatible server (moto) through s3fs, and memory://."""

import torch
from _s3server import s3fs_client

from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval

pytest_plugins = ("_s3server",)


def test_smoke(s3_url):
    m = torch.nn.Linear(4, 4)
    ck = AdaptiveCheckpointer(s3_url, model=m, keep_last=2, policy=FixedInterval(1e9))
    assert ck.restore() == 0
    for s in (1, 2, 3):
        ck.save(s)
    ck.close(finished=False)
    print(sorted(s3fs_client().find(s3_url)))
    ck = AdaptiveCheckpointer(s3_url, model=m, keep_last=2)
    assert ck.restore() == 3
    ck.close(finished=False)
