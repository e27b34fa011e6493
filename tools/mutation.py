"""Mutation testing of the modules whose bugs lose data or decide wrongly (docs/testing.md).

    python tools/mutation.py                      # every module below, one after another
    python tools/mutation.py --module policy drift  # some of them
    python tools/mutation.py --module policy --show  # also print each surviving mutant's diff

Runs mutmut 3 (the ``dev`` extra installs it) on one module at a time, each with only
its fast, relevant tests (``MODULES``), in a scratch copy of the repository under
``.mutation/<module>/`` so that the runs do not share mutmut's cache or config. Prints,
per module: mutants, killed, survived, equivalent, timeouts and the score
(killed + timeouts) / (mutants - equivalent). A mutant listed in ``EQUIVALENT`` (with the
reason no input can tell it apart from the code) is not counted against the score; one
listed there that a test now kills, or that no longer exists, is reported as stale.
Exit status 1 when a module scores below ``GOAL`` or leaves an unlisted survivor.

Slow: one pytest run per mutant, of the tests that cover the mutated function (minutes
per module on 2 cores). Not part of CI.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
GOAL = 0.90

_STORE_TESTS = [
    "tests/layercheck/test_store.py",
    *(f"tests/layercheck/test_reliability_io.py::{t}" for t in (
        "test_a_streamed_write_cut_short_leaves_neither_file_nor_temp",
        "test_a_streamed_write_writes_each_buffer_in_order",
        "test_an_fsspec_store_streams_buffers_and_discards_a_failed_object",
        "test_a_streamed_write_survives_short_writes"))]

# module -> (its source file, the tests that exercise it: pytest arguments). Only fast tests: never the
# torchrun / DeepSpeed / FSDP / browser / slow-marked ones.
MODULES: dict[str, tuple[str, list[str]]] = {
    "policy": ("layercheck/contract/policy.py", [
        "tests/layercheck/test_policy.py", "tests/layercheck/test_budget.py"]),
    "commit": ("layercheck/storage/commit.py", [
        "tests/layercheck/test_commit.py"]),  # its ranks are child processes: SPAWNED
    "drift": ("layercheck/drift/tracker.py", [
        "tests/layercheck/test_drift.py",
        # a fresh interpreter per mutant (torch import); test_fallback_without_numba
        # covers the same path in-process
        "--deselect", "tests/layercheck/test_drift.py::test_drift_imports_and_works_without_numba",
        # these run at 2 threads: torch's OpenMP team (their ops, and the pass on it) starts
        # in mutmut's parent, and a worker forked from it that runs them at 2 threads again
        # hangs in torch's own ops (the team's threads are not in the child). They test
        # layercheck.drift.kernels' threading, not drift's values; the rest run at 1 thread
        "--deselect", "tests/layercheck/test_drift.py::test_the_pass_takes_no_more_threads_than_torch_trains_with",
        "--deselect", "tests/layercheck/test_drift.py::test_kernel_is_accurate_over_millions_of_terms_and_ignores_thread_count"]),
    # drift's fused path and its Adam terms, moved out of drift.py: the same tests, and their own
    "fusedsums": ("layercheck/drift/fusedsums.py", [
        "tests/layercheck/test_fusedsums.py", "tests/layercheck/test_drift.py",
        "--deselect", "tests/layercheck/test_drift.py::test_drift_imports_and_works_without_numba",
        "--deselect", "tests/layercheck/test_drift.py::test_the_pass_takes_no_more_threads_than_torch_trains_with",
        "--deselect", "tests/layercheck/test_drift.py::test_kernel_is_accurate_over_millions_of_terms_and_ignores_thread_count"]),
    "adamupdate": ("layercheck/drift/adamupdate.py", [
        "tests/layercheck/test_adamupdate.py", "tests/layercheck/test_drift.py",
        "--deselect", "tests/layercheck/test_drift.py::test_drift_imports_and_works_without_numba",
        "--deselect", "tests/layercheck/test_drift.py::test_the_pass_takes_no_more_threads_than_torch_trains_with",
        "--deselect", "tests/layercheck/test_drift.py::test_kernel_is_accurate_over_millions_of_terms_and_ignores_thread_count"]),
    "engine": ("sim/engine.py", [
        "tests/sim/test_engine.py"]),
    "manifest": ("layercheck/storage/manifest.py", [
        "tests/layercheck/test_manifest.py", "tests/layercheck/test_cleanup.py",
        # a rank's view of a sharded manifest (in-process; not the two-process test)
        "tests/layercheck/test_commit.py::test_a_rank_reads_its_own_shard_and_drops_go_by_rank0_file",
        "tests/layercheck/test_commit.py::test_a_sharded_record_without_a_shard_per_rank_of_its_layout_is_a_problem",
        # a minute of real training per mutant; test_cleanup compacts too
        "--deselect",
        "tests/layercheck/test_manifest.py::test_under_retention_the_manifest_is_compacted_while_training"]),
    "layerread": ("layercheck/storage/layerread.py", [
        "tests/layercheck/test_manifest.py", "tests/layercheck/test_layerfile.py"]),
    **{name: (f"layercheck/storage/{name}.py", _STORE_TESTS)
       for name in ("store", "localstore", "fsspecstore", "lock", "fds", "location")},
    "writer": ("layercheck/storage/writer.py", [
        "tests/layercheck/test_writer.py"]),
    "recovery": ("layercheck/recovery.py", [
        "tests/layercheck/test_recovery.py"]),
}

# Modules whose tests run the mutated code in child processes (mp.spawn), where mutmut
# cannot record which test covers which function: every test runs for every mutant.
SPAWNED = {"commit"}

# Modules whose workers must fork from a clean server process rather than from the one
# that ran the tests (mutmut's process_isolation; slower: each worker sets its tests up).
FORKSERVER: set[str] = set()

# Mutants that no input can tell apart from the code: mutmut's name -> why. Names hold
# the function and mutmut's number for it, which change when the function changes:
# a stale entry is reported, so this list cannot silently outlive the code.
TIE = ("an exact tie: differs only when a failure lands exactly on an event instant "
       "(job end, snapshot, commit time, end of a restart), probability zero for continuous "
       "failure times; no convention is specified there and the SimPy reference resolves "
       "such ties its own way")
EQUIVALENT: dict[str, str] = {
    # policy
    "layercheck.contract.policy.xǁPolicyǁ__post_init____mutmut_4":
        "sizes kept as given (int64 for whole numbers): its only use, float(sizes[chosen].sum()), "
        "is exact in both below 2**53 bytes, and the checks accept and reject the same values",
    "layercheck.contract.policy.xǁPolicyǁ__post_init____mutmut_6": "as __post_init__ 4 (dtype dropped)",
    "layercheck.contract.policy.xǁPolicyǁfrom_config__mutmut_44":
        "sizes' dtype: Policy.__post_init__ converts them to float64 anyway",
    "layercheck.contract.policy.xǁPolicyǁfrom_config__mutmut_46": "as from_config 44",
    "layercheck.contract.policy.xǁPolicyǁthresholds__mutmut_3":
        "lr_ratio kept as given: base (float64) * ratio converts an int or float32 ratio "
        "exactly, so K is bit for bit the same",
    "layercheck.contract.policy.xǁPolicyǁthresholds__mutmut_5": "as thresholds 3",
    "layercheck.contract.policy.xǁPolicyStateǁ__post_init____mutmut_5":
        "np.zeros without a dtype is float64: the same array",
    "layercheck.contract.policy.xǁPolicyStateǁ__post_init____mutmut_7": "as PolicyState.__post_init__ 5",
    "layercheck.contract.policy.xǁPolicyStateǁobserve__mutmut_37":
        "np.full of an IntEnum value without a dtype is int64: the same array",
    "layercheck.contract.policy.xǁPolicyStateǁobserve__mutmut_40": "as observe 37",
    "layercheck.contract.policy.xǁPolicyStateǁmark_written__mutmut_7":
        "list() of a 1-D index array, converted back to int64, is the same index array",
    "layercheck.contract.policy.x_replay__mutmut_3":
        "drift kept as given: accumulating int or float32 drift into the float64 "
        "accumulators converts each value exactly, as float64 input does",
    "layercheck.contract.policy.x_replay__mutmut_5": "as replay 3",
    # sim.engine
    "sim.engine.xǁ_Stackǁ__init____mutmut_19":
        "3 * horizon + 10 instead of 2 * horizon + 10: any shift longer than the longest "
        "timeline keeps the stacked blocks apart; the searches give the same positions",
    "sim.engine.xǁ_Stackǁ__init____mutmut_20": "2 * horizon + 11: as _Stack.__init__ 19",
    "sim.engine.xǁ_Stackǁ__init____mutmut_33": "astype(None) is astype(float64): the same array",
    "sim.engine.xǁ_Stackǁ_tier__mutmut_7":
        "the sentinel key -2 instead of -1: both lie below every time >= 0 of the block and "
        "above the previous block's keys, so every search lands on the same entry",
    "sim.engine.x_run_lanes__mutmut_5":
        "counts without dtype: lengths are Python ints, so the array is int64 anyway",
    "sim.engine.x_run_lanes__mutmut_7": "as run_lanes 5",
    "sim.engine.x_run_lanes__mutmut_24":
        "the pad after a row's last failure (2.0 instead of 1.0) is read only for the last "
        "segment, which has no failure: the tier it picks feeds only values used where fail",
    "sim.engine.x_run_lanes__mutmut_31":
        "an unstable sort of the lanes by failure count: lanes are independent and the "
        "inverse permutation puts every result back in lane order",
    "sim.engine.x_run_lanes__mutmut_33": "as run_lanes 31 (argsort's default kind)",
    "sim.engine.x_run_lanes__mutmut_35": "kind='STABLE': numpy reads kinds case-insensitively",
    "sim.engine.x_run_lanes__mutmut_57":
        "one more turn of the loop advances an empty slice of lanes: no effect",
    "sim.engine.x_run_lanes__mutmut_58":
        "with no lanes, one turn over an empty slice instead of none: no effect "
        "(test_no_lanes_give_empty_results)",
    "sim.engine.x_run_lanes__mutmut_66": "side='left' is searchsorted's default",
    "sim.engine.xǁ_Lanesǁadvance__mutmut_180":
        "event counts as float64 instead of int64 in a float64 total: the same sums",
    "sim.engine.xǁ_Lanesǁadvance__mutmut_181": "as advance 180",
    "sim.engine.xǁ_Lanesǁ_whole_jobs__mutmut_29":
        "work[off] is position 0 of the timeline (no step done): 0, so + and - agree",
    "sim.engine.xǁ_Lanesǁ_whole_jobs__mutmut_65": "checkpoints[off] is 0: as _whole_jobs 29",
    "sim.engine.xǁ_Lanesǁ_whole_jobs__mutmut_77": "written[off] is 0: as _whole_jobs 29",
    # exact ties: failure times are continuous, so these comparisons differ only when a
    # failure lands exactly on an event instant (probability zero). No convention is
    # specified there, and the SimPy reference resolves such ties differently anyway.
    "sim.engine.xǁ_Lanesǁadvance__mutmut_18": TIE,
    "sim.engine.xǁ_Lanesǁadvance__mutmut_54": TIE,
    "sim.engine.xǁ_Lanesǁadvance__mutmut_169": TIE,
    "sim.engine.xǁ_Lanesǁadvance__mutmut_183": TIE,
    "sim.engine.xǁ_Lanesǁ_commit__mutmut_13": TIE,
    "sim.engine.xǁ_Lanesǁ_commit__mutmut_24": TIE,
    "sim.engine.xǁ_Lanesǁ_commit__mutmut_45":
        "u < p vs u <= p for a uniform draw u: they differ only when u equals the loss "
        "probability exactly (probability zero)",
    "sim.engine.x_run_limit__mutmut_37": TIE,
    # drift (its fused path in fusedsums, its Adam terms in adamupdate since the split)
    "layercheck.drift.tracker.xǁDriftTrackerǁ__init____mutmut_43":
        "_previous starts as None instead of {}: only the copy fallback reads it, and it "
        "sets it itself; Adam never touches it",
    "layercheck.drift.tracker.xǁDriftTrackerǁ__init____mutmut_47": "np.zeros without a dtype is float64: the same array",
    "layercheck.drift.tracker.xǁDriftTrackerǁ__init____mutmut_49": "as DriftTracker.__init__ 47",
    "layercheck.drift.tracker.xǁDriftTrackerǁtake__mutmut_9":
        "errstate(divide=...) unset: the division's denominator is never 0 "
        "(np.where(total > 0, total, 1.0)), so there is no division by zero to silence",
    "layercheck.drift.tracker.xǁDriftTrackerǁtake__mutmut_11": "as take 9",
    "layercheck.drift.tracker.xǁDriftTrackerǁtake__mutmut_33":
        "the inner where with >= 0: it then divides by 0 where total is 0, but the outer "
        "where takes the other branch there (and errstate silences it)",
    "layercheck.drift.tracker.xǁDriftTrackerǁtake__mutmut_35":
        "the inner where's 2.0: used only where total is 0, where the outer where takes the "
        "other branch",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_after_step__mutmut_8":
        "_updates also for other optimizers: their state holds no exp_avg, so it returns "
        "nothing, as the {} it replaces",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_8":
        "`not state and ...` for `not state or ...`: torch's Adam state either is empty or "
        "holds exp_avg, and both forms agree in both cases",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_18":
        "reading the optimizer's own step count every step instead of counting: Adam adds "
        "one per step, as the tracker does (the count saves a device sync, not a value)",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_19": "as _updates 18",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_22": "as _updates 18",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_29": "as _updates 18",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_33":
        "at lr 0 the scale is 0, so moved is 0 whatever eps_c, alpha or shrink are",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_34": "as _adam_terms 33",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_36": "as _adam_terms 33",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_40":
        "the default of group.get('weight_decay'): torch's Adam and AdamW groups always "
        "hold the key",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_42": "as _adam_terms 40",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_45": "as _adam_terms 40",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_48":
        "the default of group.get('decoupled_weight_decay'): torch 2.13's Adam and AdamW "
        "groups always hold the key",
    "layercheck.drift.adamupdate.x_adam_terms__mutmut_50": "as _adam_terms 48",
    "layercheck.drift.fusedsums.xǁFusedSumsǁsums__mutmut_23":
        "the v address 1 for an entry without moments: the kernel reads m and v only where "
        "the m address is non-zero (kernels._run_sums, _sums' prefetch)",
    "layercheck.drift.fusedsums.xǁFusedSumsǁsums__mutmut_52":
        "np.array of Python ints without a dtype is int64, which is np.intp on the 64-bit "
        "platforms torch supports: the same array",
    "layercheck.drift.fusedsums.xǁFusedSumsǁsums__mutmut_54": "as FusedSums.sums 52",
    "layercheck.drift.fusedsums.xǁFusedSumsǁsums__mutmut_77":
        "the addresses without dtype=int64: Python ints below 2**63 (user-space addresses "
        "and 0) make an int64 array anyway",
    "layercheck.drift.fusedsums.xǁFusedSumsǁsums__mutmut_79": "as FusedSums.sums 77",
    "layercheck.drift.fusedsums.xǁ_Layoutǁof__mutmut_11": "the layers' dtype dropped: as FusedSums.sums 52",
    "layercheck.drift.fusedsums.xǁ_Layoutǁof__mutmut_13": "as _Layout.of 11",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_buffers__mutmut_6":
        "the scratch buffer not reused: a fresh one each call holds the same values "
        "(reuse saves page faults, not results)",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_buffers__mutmut_7": "as _buffers 6",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_buffers__mutmut_10": "reallocating also at equal size: as _buffers 6",
    # manifest
    "layercheck.storage.layerread.x_read_verified_file__mutmut_4":
        "rpartition for partition on 'algorithm:hex': a checksum holds one colon",
    "layercheck.storage.layerread.x_read_verified_file__mutmut_19":
        "no read limit: a regular file longer than committed is read whole and refused with "
        "the same message (the limit only bounds the memory)",
    "layercheck.storage.layerread.x_read_verified_file__mutmut_29":
        "as read_verified_file 19, read apart: a size other than the committed one is read "
        "whole (_Split.targets) and refused with the same message",
    "layercheck.storage.manifest.x_encode_manifest__mutmut_9":
        "the sort key's name for a state ('XXXX' for ''): a step has one state, after its "
        "layers by the key before it",
    "layercheck.storage.layerread.x_read_verified_file__mutmut_47":
        "<= for <: that branch is taken only when the sizes differ",
    # recovery
    "layercheck.recovery.x_parse_safetensors__mutmut_9":
        "every warning ignored in that block, not only torch's read-only buffer one: views "
        "of a parsed header's tensors raise no other warning",
    "layercheck.recovery.x_parse_safetensors__mutmut_13":
        "the filter's message in lower case: warnings matches it case-insensitively",
    "layercheck.recovery.x_parse_safetensors__mutmut_14": "in upper case: as parse_safetensors 13",
    "layercheck.recovery.xǁPlannerǁ__init____mutmut_2":
        "keep_bytes' default 1 for 0: no committed file is 1 byte or less (a safetensors "
        "file starts with an 8-byte header length), so neither keeps a file",
    "layercheck.recovery.xǁPlannerǁ__init____mutmut_29":
        "_kept None until the first layers(): load() takes a planned version, so layers() "
        "has set _kept before any load()",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_4":
        "np.full of a Python int without a dtype is int64: the same array",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_7": "as _agreed 4",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_11": "as _agreed 4",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_14": "as _agreed 4",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_16":
        "the 'not chosen yet' mark -3 for -2: any negative mark differs from every bound "
        "(a step, >= 0), so every item is chosen in the first round, which overwrites the mark",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_54":
        "`or` for `and` in the elif: with keep (the state) held is not used; without keep the "
        "elif is reached only with a file, where both forms agree",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_65":
        "-2 for -1 as 'no intact version': both are < 0 (CheckpointNotFound, with the same "
        "words) and neither is _FAILED (-3)",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_73":
        "agreed <= 0 for < 0: they differ only for a version of step 0, and LayerCheck "
        "numbers steps from 1 (step() counts the step before it writes), so no committed "
        "version has step 0",
    "layercheck.recovery.xǁPlannerǁ_agreed__mutmut_74": "agreed < 1 for < 0: as _agreed 73",
    "layercheck.recovery.xǁPlannerǁlayers__mutmut_12": "keep=None for keep=False: _agreed only tests its truth",
    "layercheck.recovery.xǁPlannerǁlayers__mutmut_19":
        "`or` for `and`: a version chosen without its file kept (beyond keep_bytes) is then "
        "kept as None, and load() pops None and reads the file again, as for no entry; a "
        "file without a version does not occur (_newest_intact gives both or neither)",
    "layercheck.recovery.xǁPlannerǁtogether__mutmut_7":
        "np.array of a Python int without a dtype is int64: the same array",
    "layercheck.recovery.xǁPlannerǁtogether__mutmut_9": "as together 7",
    "layercheck.recovery.xǁPlannerǁtogether__mutmut_12":
        "what a rank that did not fail proposes (1 for 0): only _FAILED (-3) is looked for "
        "in the agreed values",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_3":
        "a placeholder no read sees: read_verified_file reads data_start (and apart, "
        "apart_keys) only when targets parsed the header, and targets sets them then",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_4": "as _Split.__init__ 3",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_5":
        "a placeholder no read sees: targets sets data before the read can end with the "
        "committed size (every read asks for the first buffer; only a shrunk file, refused "
        "as short, stops it earlier)",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_7": "as _Split.__init__ 5",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_9": "as _Split.__init__ 5",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_10": "as _Split.__init__ 5",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_11": "as _Split.__init__ 3 (apart)",
    "layercheck.storage.layerread.xǁ_Splitǁ__init____mutmut_12": "as _Split.__init__ 3 (apart_keys)",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_14":
        "n of a head shorter than 8 bytes: that is a file shorter than 8 bytes, where no "
        "n >= 0 satisfies n <= size - 8 < 0, so the file is read whole either way",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_23": "as _Split.targets 14 (+1 for -1)",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_24": "as _Split.targets 14 (-2 for -1)",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_28":
        "a header length of 0 not tried: the empty text is no JSON, so the original reads "
        "the file whole too, after an empty read that adds no byte",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_29": "as _Split.targets 28",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_45":
        "the file's name in _header's message: targets drops that error (the file is read "
        "whole and parse_header names it)",
    "layercheck.storage.layerread.xǁ_Splitǁtargets__mutmut_51": "as _Split.targets 45",
    # writer
    "layercheck.storage.writer.xǁWriterǁclose__mutmut_1":
        "_retire(None) for _retire([]): both are falsy, and _retire reads its versions only "
        "under `if versions`",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_1":
        "the first `what` (the manifest) is read only if _write_layers itself raises, which it "
        "cannot while the writer thread runs (close shuts the file pool down only after the "
        "thread has ended); every other path sets `what` again before it can be read",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_2": "as _persist 1",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_3": "as _persist 1",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_10":
        "the first value of `committed` is never read: it is set again from the versions "
        "before the commit, and a failed job commits [] instead",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_24":
        "the message of an unreachable branch (a layer neither written nor failed): a write "
        "returns None only once another has failed, and that failure's exception is among "
        "the outcomes, so the loop raises it before the count is compared",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_25": "as _persist 24",
    "layercheck.storage.writer.xǁWriterǁ_persist__mutmut_70":
        "the job's versions handed to the commit with its error too: no commit reads them "
        "then (Commit raises the error first; ShardedCommit only sends them to the other "
        "ranks, and any rank's error raises before anything is merged or appended)",
    "layercheck.storage.writer.xǁWriterǁ__init____mutmut_27":
        "_job_committed None for False in the constructor: never read before _run sets it to "
        "False at the start of each job (its only read, in _run's handler, comes after that)",
    "layercheck.storage.writer.xǁWriterǁ__init____mutmut_28": "True for False: as __init__ 27",
    "layercheck.storage.writer.xǁWriterǁ_run__mutmut_4":
        "_job_committed None for False at the start of a job: its only use is its truth in "
        "raise_if_failed's message (committed or not), and None is false like False",
    # commit
    "layercheck.storage.commit.x_all_gather_json__mutmut_10":
        "torch.tensor of a Python int without a dtype is int64: the same tensor",
    "layercheck.storage.commit.x_all_gather_json__mutmut_12": "as all_gather_json 10",
    # store
    "layercheck.storage.store.x_is_temporary__mutmut_6":
        "the last element of rsplit('/') is the last path component for any maxsplit",
    "layercheck.storage.store.x_is_temporary__mutmut_9": "as is_temporary 6",
    "layercheck.storage.localstore.xǁLocalStoreǁ_make_parents__mutmut_3":
        "[+2::-1] for [-2::-1]: the walk also visits '.', the root, which exists: skipped",
    "layercheck.storage.localstore.xǁLocalStoreǁ_path__mutmut_6": "[+2::-1]: as _make_parents 3 (the root is not a link: it is resolved)",
    "layercheck.storage.localstore.xǁLocalStoreǁ__init____mutmut_16":
        "_lock_key '' instead of None: unlock pops '' from the held locks, finds nothing, as with None",
    "layercheck.storage.localstore.xǁLocalStoreǁ_writable__mutmut_4": "same = None instead of False: both falsy",
    "layercheck.storage.localstore.xǁLocalStoreǁlock__mutmut_2":
        "_writable is called for its check that the directory is the one opened; the path's "
        "name does not matter",
    "layercheck.storage.localstore.xǁLocalStoreǁlock__mutmut_3": "as lock 2",
    "layercheck.storage.localstore.xǁLocalStoreǁlock__mutmut_44":
        "reading 33 bytes of the holder's pid instead of 32: a pid and newline are shorter",
    "layercheck.storage.localstore.xǁLocalStoreǁlock__mutmut_59":
        "truncating to 1 byte, then writing the pid over byte 0 on: the same content",
    "layercheck.storage.localstore.xǁLocalStoreǁunlock__mutmut_3":
        "popping the held lock also when _lock_key is None: nothing is held under None",
    "layercheck.storage.localstore.xǁLocalStoreǁunlock__mutmut_8": "as LocalStore.__init__ 16",
    "layercheck.storage.fds.x_fill__mutmut_3":
        "one more readv once the view is full: into an empty slice, it returns 0 and the loop ends",
    "layercheck.storage.localstore.xǁLocalStoreǁread_buffer__mutmut_32":
        "buffer[:done] also when done == size: the same bytes (a view of the whole buffer)",
    "layercheck.storage.localstore.xǁLocalStoreǁread_into__mutmut_33":
        "one more read past the targets once size bytes are in: os.read of 0 bytes returns "
        "b'' and the loop ends",
    "layercheck.storage.store.x_read_into__mutmut_38":
        "the rest past the targets consumed also when there is none: consume gets an empty "
        "piece, which adds no byte (the checksum is unchanged)",
    "layercheck.storage.fds.x_read_all__mutmut_2":
        "one more read at the end: os.read of 0 bytes returns b'' and the loop ends",
    "layercheck.storage.fds.x_read_all__mutmut_14": "the size of each read call (2**27 for 2**26): the same bytes",
    "layercheck.storage.fds.x_read_all__mutmut_15": "as _read_all 14",
    "layercheck.storage.location.x_open_store__mutmut_33":
        "LocalStore without create=False: open_store has already refused a missing "
        "directory then, and creating an existing one changes nothing",
    "layercheck.storage.localstore.xǁLocalStoreǁlist__mutmut_14": "follow_symlinks=None is falsy, as False",
    "layercheck.storage.fds.x_write_all__mutmut_5":
        "a memoryview cast to signed bytes writes the same memory",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁappend__mutmut_7":
        "an invalid open mode raises ValueError, and the fallback rewrites the object whole: "
        "the same bytes",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁappend__mutmut_8": "as FsspecStore.append 7",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁread__mutmut_2": "cat_file's start None is 0",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁread__mutmut_5": "as FsspecStore.read 2 (start's default)",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_1": "FsspecStore.list ignores temporary (no temp files on object stores)",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_14": "the last element of rsplit('/') for any maxsplit: as is_temporary 6",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_16":
        "rstrip(None) for rstrip('/'): fsspec's ls names files without a trailing '/' and "
        "store names have no trailing whitespace",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_17": "lstrip('/') for rstrip('/'): as FsspecStore.list 16",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_20": "as FsspecStore.list 14",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_21": "[+1] of a two-element rsplit is its [-1]",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁlist__mutmut_25": "detail=None is falsy, as detail=False",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_updates__mutmut_30":
        "the cache check on id(None): it always misses, and the terms are computed "
        "anew under the right key: the same values",
}

# Survivors that are not equivalent but that no test here can kill, and why. They count
# as survived in the score.
UNTESTABLE: dict[str, str] = {
    "layercheck.storage.lock.x__forget_locks_in_child__mutmut_1":
        "runs only in a forked child, where mutmut records no coverage (so it has no test "
        "to run); test_a_forked_child_holds_none_of_its_parents_locks fails on it when the "
        "mutation is made by hand",
    "layercheck.storage.commit.x_all_gather_json__mutmut_22":
        "the exchange on the default group instead of the commit's own: in a test both span "
        "the same two ranks; only a job running other collectives on the default group at "
        "the same time (training's all-reduces beside the writer's commits) tells",
    "layercheck.storage.commit.x_all_gather_json__mutmut_25": "as all_gather_json 22",
    "layercheck.storage.commit.x_all_gather_json__mutmut_43": "as all_gather_json 22",
    "layercheck.storage.commit.x_all_gather_json__mutmut_46": "as all_gather_json 22",
    "layercheck.storage.commit.xǁShardedCommitǁcommit__mutmut_27": "as all_gather_json 22",
    "layercheck.storage.commit.xǁShardedCommitǁcommit__mutmut_80": "as all_gather_json 22",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁ__init____mutmut_5":
        "storage options dropped: they matter only to filesystems that take them "
        "(credentials, endpoints); memory:// takes none and nothing else is reachable here",
    "layercheck.storage.location.x_open_store__mutmut_17": "as FsspecStore.__init__ 5",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁ__init____mutmut_7":
        "the root's trailing '/' kept: memory:// normalises the doubled '/' in its paths "
        "(tested: a URL with a trailing slash is the same store); an object store whose "
        "keys keep it would tell",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁ__init____mutmut_8": "as FsspecStore.__init__ 7 (lstrip: memory:// adds the leading '/')",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁ__init____mutmut_9": "as FsspecStore.__init__ 7",
    "layercheck.storage.localstore.xǁLocalStoreǁappend__mutmut_4":
        "the fsync of a new file's folder: only a power cut tells whether the new directory "
        "entry was durable",
    "layercheck.storage.localstore.xǁLocalStoreǁappend__mutmut_5": "as LocalStore.append 4",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_1":
        "discard() of a failed streamed upload: memory:// files have none (the object is "
        "deleted anyway); only an object store with multipart uploads tells",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_3": "as _abandon 1",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_6": "as _abandon 1",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_7": "as _abandon 1",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_8": "as _abandon 1",
    "layercheck.storage.fsspecstore.x__abandon__mutmut_9": "as _abandon 1",
    "layercheck.storage.fsspecstore.xǁFsspecStoreǁwrite_atomic__mutmut_17": "as _abandon 1",
    "layercheck.drift.tracker.xǁDriftTrackerǁ__init____mutmut_62":
        "the copy warning's stacklevel (3): mutmut's trampoline adds frames, so a test of "
        "the warning's reported line cannot run under mutmut (it does outside it)",
    "layercheck.drift.tracker.xǁDriftTrackerǁ__init____mutmut_69": "as DriftTracker.__init__ 62 (stacklevel 4)",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_buffers__mutmut_14":
        "torch.empty on the default device instead of the tensors' own: the same on a "
        "CPU, wrong on a GPU; this machine has none",
    "layercheck.drift.tracker.xǁDriftTrackerǁ_buffers__mutmut_17": "as _buffers 14",
}

PYTEST_ARGS = ["-p", "no:cacheprovider", "-q", "--hypothesis-seed=0", "-m", "not slow and not browser"]
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          37: "killed", -11: "killed"}  # -11: the tests crashed (SIGSEGV): a failure seen


def _configure(work: Path, module: str) -> None:
    """The scratch copy's pyproject.toml: the repository's, with mutmut's config for ``module``."""
    source, tests = MODULES[module]
    package = source.split("/")[0]
    config = "\n".join([
        "", "[tool.mutmut]",
        f"source_paths = [{json.dumps(package)}]",
        f"only_mutate = [{json.dumps(source)}]",
        'also_copy = ["traces"]',
        f"pytest_add_cli_args = {json.dumps(PYTEST_ARGS)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        "use_git_change_detection = false",
        "timeout_constant = 5.0",  # seconds on top of the tests' own time: the machine is shared
        f'process_isolation = "{"forkserver" if module in FORKSERVER else "fork"}"',
        ""])
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)


def _prepare(module: str) -> Path:
    """A fresh scratch copy of the sources and tests with a mutmut config for ``module``."""
    work = SCRATCH / module
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for tree in ("layercheck", "sim", "tests"):
        shutil.copytree(ROOT / tree, work / tree, ignore=ignore)
    (work / "traces").symlink_to(ROOT / "traces")  # shipped captures some tests read
    _configure(work, module)
    return work


def _cover_all(work: Path, module: str, env: dict) -> None:
    """mutmut's stats file saying that each selected test covers each mutated function."""
    functions = {re.sub(r"__mutmut_\d+$", "", name) for name in _results(work)}
    args = [a for a in PYTEST_ARGS if a != "-q"]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args,
                             *MODULES[module][1]], cwd=work / "mutants", env=env,
                            capture_output=True, text=True)
    tests = [line for line in listed.stdout.splitlines() if "::" in line]
    if not functions or not tests:
        raise SystemExit(f"mutation: no mutants or no tests for {module}:\n{listed.stdout[-2000:]}")
    (work / "mutants" / "mutmut-stats.json").write_text(json.dumps(dict(
        tests_by_mangled_function_name={f: tests for f in sorted(functions)},
        # the time each test may take: mutmut's timeout is 15 x (their sum + 5 s)
        duration_by_test={t: 4.0 for t in tests}, stats_time=0.0)))
    for meta in (work / "mutants").rglob("*.py.meta"):  # forget the first run's verdicts
        data = json.loads(meta.read_text())
        data["exit_code_by_key"] = dict.fromkeys(data["exit_code_by_key"])
        meta.write_text(json.dumps(data))


def _results(work: Path) -> dict[str, str]:
    """mutant name -> status, from mutmut's per-file record."""
    out: dict[str, str] = {}
    for meta in (work / "mutants").rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = STATUS.get(code, "suspicious") if code is not None else "not checked"
    return out


def _refresh_tests(module: str) -> tuple[Path, list[str]]:
    """The last run's scratch copy with today's tests, and its surviving mutants."""
    work = SCRATCH / module
    source = MODULES[module][0]
    if not (work / "mutants").is_dir() or (work / source).read_bytes() != (ROOT / source).read_bytes():
        raise SystemExit(f"mutation: --survivors needs a previous run of {module} on the same "
                         f"{source}: run without --survivors first")
    _configure(work, module)  # today's test selection too
    shutil.copy2(work / "pyproject.toml", work / "mutants" / "pyproject.toml")
    for target in (work / "tests", work / "mutants" / "tests"):
        shutil.rmtree(target)
        shutil.copytree(ROOT / "tests", target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return work, sorted(n for n, s in _results(work).items() if s not in ("killed", "timeout"))


def run(module: str, *, children: int, show: bool, survivors: bool = False) -> dict:
    names: list[str] = []
    if survivors:
        work, names = _refresh_tests(module)
    else:
        work = _prepare(module)
    env = dict(os.environ, LAYERCHECK_ALLOW_SKIPS="1", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    mutmut = [sys.executable, "-m", "mutmut"]
    started = time.monotonic()
    log = work / "mutmut.log"
    command = [*mutmut, "run", "--max-children", str(children), *names]
    with open(log, "w") as fh:
        if module in SPAWNED and not survivors:
            # a first run makes the mutants and stops (no covering test found); then every
            # test is recorded as covering every function, and the second run uses that
            subprocess.run(command, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT)
            _cover_all(work, module, env)
        done = subprocess.run(command, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    results = _results(work)
    if done.returncode != 0 or not results or (survivors and not names):
        tail = log.read_text()[-3000:]
        raise SystemExit(f"mutation: mutmut failed on {module} (exit {done.returncode}); "
                         f"its log: {log}\n{tail}")
    count = {s: sum(1 for v in results.values() if v == s) for s in set(results.values())}
    left = sorted(n for n, s in results.items() if s not in ("killed", "timeout"))
    equivalent = [n for n in left if n in EQUIVALENT]
    untestable = [n for n in left if n in UNTESTABLE]
    unexplained = [n for n in left if n not in EQUIVALENT and n not in UNTESTABLE]
    prefix = source_prefix(module)
    stale = sorted(n for n in {**EQUIVALENT, **UNTESTABLE} if n.startswith(prefix + ".")
                   and results.get(n) not in ("survived", "no tests"))
    total = len(results)
    scored = total - len(equivalent)
    score = (count.get("killed", 0) + count.get("timeout", 0)) / scored if scored else 1.0
    row = dict(module=module, mutants=total, killed=count.get("killed", 0),
               survived=len(left), equivalent=len(equivalent), timeouts=count.get("timeout", 0),
               score=score, wall_s=round(wall), unexplained=unexplained, stale=stale,
               untestable=untestable)
    (work / "summary.json").write_text(json.dumps(dict(row, survivors=left), indent=1))
    if show:
        for name in unexplained:
            diff = subprocess.run([*mutmut, "show", name], cwd=work, env=env, capture_output=True,
                                  text=True).stdout
            print(diff)
    return row


def source_prefix(module: str) -> str:
    """mutmut's name of the module (``layercheck.contract.policy``)."""
    return re.sub(r"\.py$", "", MODULES[module][0]).replace("/", ".")


def report(modules: list[str]) -> int:
    """The last runs' figures (``.mutation/<module>/summary.json``) as markdown, with
    each survivor's reason as listed now."""
    print("| module | mutants | killed | survived | equivalent | untestable | other survivors "
          "| timeouts | score | wall |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for module in modules:
        path = SCRATCH / module / "summary.json"
        if not (SCRATCH / module / "mutants").is_dir():
            continue
        results = _results(SCRATCH / module)  # the verdicts as they stand now
        row = json.loads(path.read_text()) if path.exists() else {"wall_s": "?"}
        row.update(mutants=len(results), killed=sum(v == "killed" for v in results.values()),
                   timeouts=sum(v == "timeout" for v in results.values()))
        left = sorted(n for n, v in results.items() if v not in ("killed", "timeout"))
        eq = [n for n in left if n in EQUIVALENT]
        un = [n for n in left if n in UNTESTABLE]
        other = [n for n in left if n not in EQUIVALENT and n not in UNTESTABLE]
        scored = row["mutants"] - len(eq)
        score = (row["killed"] + row["timeouts"]) / scored if scored else 1.0
        print(f"| {module} | {row['mutants']} | {row['killed']} | {len(left)} | {len(eq)} | "
              f"{len(un)} | {len(other)} | {row['timeouts']} | {score:.1%} | {row['wall_s']} s |")
        rows.append((module, eq, un, other))
    for module, eq, un, other in rows:
        for title, names, why in (("equivalent", eq, EQUIVALENT), ("untestable here", un, UNTESTABLE),
                                  ("not killed", other, {})):
            if names:
                print(f"\n{module}, {title}:\n")
                for name in names:
                    print(f"- `{name.split('.', 1)[1]}`: {why.get(name, 'see the report')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from layercheck.contract.errors import OneLineParser  # the project's one-line errors, exit 2
    parser = OneLineParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", nargs="+", choices=sorted(MODULES), default=list(MODULES),
                        help="modules to test (default: all)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--show", action="store_true", help="print the diff of each unexplained survivor")
    parser.add_argument("--survivors", action="store_true",
                        help="re-test only the last run's survivors against today's tests (the "
                             "module's code unchanged); for iterating, not for the figures")
    parser.add_argument("--report", action="store_true",
                        help="print the last runs' figures as a markdown table (runs nothing)")
    args = parser.parse_args(argv)
    if args.report:
        return report(args.module)
    try:
        import mutmut  # noqa: F401
    except ImportError:
        parser.exit(2, "mutation: mutmut is not installed: pip install -c constraints.txt -e '.[dev]'\n")
    rows = []
    print(f"{'module':10} {'mutants':>7} {'killed':>6} {'survived':>8} {'equiv':>5} {'timeout':>7} "
          f"{'score':>6} {'wall':>6}")
    for module in args.module:
        row = run(module, children=args.max_children, show=args.show, survivors=args.survivors)
        rows.append(row)
        print(f"{module:10} {row['mutants']:7} {row['killed']:6} {row['survived']:8} "
              f"{row['equivalent']:5} {row['timeouts']:7} {row['score']:6.1%} {row['wall_s']:5}s",
              flush=True)
        for name in row["unexplained"]:
            print(f"  survived, not listed as equivalent: {name}")
        for name in row["stale"]:
            print(f"  stale EQUIVALENT entry (killed or gone): {name}")
    bad = [r for r in rows if r["score"] < GOAL or r["unexplained"] or r["stale"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
