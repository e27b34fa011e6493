"""What ranks agree on: for one process, every agreement is immediate and local."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from layercheck.storage.commit import Commit
from layercheck.contract.errors import LayerCheckError
from layercheck.backends.ranks import DefaultGroupRanks, ProcessGroupRanks, Ranks
from tests.conftest import in_a_fresh_python


def test_one_process_agrees_with_itself():
    ranks = Ranks()
    sums = np.array([[1.0, 2.0], [3.0, 4.0]])
    reduced = ranks.all_reduce_sum(sums)
    assert np.array_equal(reduced, sums) and reduced is not sums  # the caller may reset its own
    low, same = ranks.agree_min(np.array([5, -1, 3]))
    assert low.tolist() == [5, -1, 3] and same
    ranks.barrier()
    assert ranks.is_coordinator and not ranks.sharded and type(ranks.commit()) is Commit
    assert ranks.gather({"a": 1}) == [{"a": 1}] and ranks.from_coordinator("x") == "x"
    assert ranks.max(2) == 2.0 and ranks.all_reduce_sum([1, 2]).tolist() == [1.0, 2.0]


def _made_without_a_process_group() -> str:
    try:
        ProcessGroupRanks()
    except LayerCheckError as exc:
        return str(exc)
    return "made"


def test_process_group_ranks_need_a_process_group():
    # a fresh Python: this one may hold a group another test file left up
    assert "after deepspeed.initialize" in in_a_fresh_python(_made_without_a_process_group)


def test_close_destroys_the_process_groups_it_made(tmp_path):
    """A gloo process group still alive when the interpreter exits can abort the process
    ("terminate called without an active exception": its threads are torn down
    unjoined), which turns a finished job into a failed one. LayerCheck made two groups
    of its own; close() destroys them (here a real one-process group)."""
    mine_alive, default_alive = in_a_fresh_python(_close_in_a_one_rank_job, str(tmp_path))
    assert not mine_alive
    assert default_alive  # the default group is the job's, not ours


def _close_in_a_one_rank_job(root: str) -> tuple[bool, bool]:
    """Whether LayerCheck's own groups, then the job's default group, are still alive
    after close() (in a fresh Python: this one may hold a group already)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from layercheck import LayerCheck, LayerCheckConfig
    dist.init_process_group("gloo", init_method=f"file://{Path(root) / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        ranks = ProcessGroupRanks()
        mine = [ranks._step_group, ranks._commit_group]
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        lc = LayerCheck(model, opt, Path(root) / "c", LayerCheckConfig(warmup_steps=1),
                        ranks=ranks)
        assert lc.restore() == 0
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            lc.step()
        lc.close()
        live = dist.distributed_c10d._world.pg_map
        return any(g in live for g in mine), dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_ranks_are_closed_when_what_is_built_on_them_fails():
    """The backends' shared cleanup: a failure inside ``closed_on_failure`` closes the
    ranks (and is raised as it was); a success leaves them open for the lifecycle."""
    class Counted(Ranks):
        closed = 0

        def close(self) -> None:
            self.closed += 1

    ranks = Counted()
    with ranks.closed_on_failure() as same:
        assert same is ranks
    assert ranks.closed == 0
    try:
        with ranks.closed_on_failure():
            raise LayerCheckError("refused")
    except LayerCheckError as exc:
        assert str(exc) == "refused"
    assert ranks.closed == 1


def test_the_default_groups_ranks_agree_over_it_and_make_no_group(tmp_path):
    """The profiler's jobs agree over the job's default group, in the library's words;
    they make no group of their own, and refuse to be a LayerCheck's ranks (whose
    writer thread needs one)."""
    answers = in_a_fresh_python(_default_group_ranks_in_a_one_rank_job, str(tmp_path))
    assert answers == {"sum": [1.5, 2.0], "min": ([3, -1], True), "gather": [{"r": 0}],
                       "from_coordinator": "mine", "max": 4.0, "coordinator": True,
                       "world_size": 1, "groups_made": 0,
                       "commit": "give it ProcessGroupRanks()"}


def _default_group_ranks_in_a_one_rank_job(root: str) -> dict:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{Path(root) / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        before = len(dist.distributed_c10d._world.pg_map)
        ranks = DefaultGroupRanks()
        low, same = ranks.agree_min(np.array([3, -1]))
        ranks.barrier()
        try:
            ranks.commit()
            refused = "committed"
        except LayerCheckError as exc:
            refused = str(exc).rsplit("; ", 1)[-1]
        return {"sum": ranks.all_reduce_sum([1.5, 2]).tolist(), "min": (low.tolist(), same),
                "gather": ranks.gather({"r": 0}), "from_coordinator": ranks.from_coordinator("mine"),
                "max": ranks.max(4), "coordinator": ranks.is_coordinator,
                "world_size": ranks.world_size,
                "groups_made": len(dist.distributed_c10d._world.pg_map) - before,
                "commit": refused}
    finally:
        dist.destroy_process_group()
