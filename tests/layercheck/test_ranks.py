"""What ranks agree on: for one process, every agreement is immediate and local."""
from __future__ import annotations

import numpy as np
import pytest

from layercheck.commit import Commit
from layercheck.errors import LayerCheckError
from layercheck.ranks import ProcessGroupRanks, Ranks


def test_one_process_agrees_with_itself():
    ranks = Ranks()
    sums = np.array([[1.0, 2.0], [3.0, 4.0]])
    reduced = ranks.all_reduce_sum(sums)
    assert np.array_equal(reduced, sums) and reduced is not sums  # the caller may reset its own
    low, same = ranks.agree_min(np.array([5, -1, 3]))
    assert low.tolist() == [5, -1, 3] and same
    ranks.barrier()
    assert ranks.is_coordinator and not ranks.sharded and type(ranks.commit()) is Commit


def test_process_group_ranks_need_a_process_group():
    with pytest.raises(LayerCheckError, match="after deepspeed.initialize"):
        ProcessGroupRanks()
