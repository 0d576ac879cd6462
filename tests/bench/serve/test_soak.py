"""The mixed soak of `aogpt bench serve --workload mixed`, half a minute long, as the suite runs it: 32
clients send the six request kinds (seeds, streams, streams cut by their client, malformed
requests) to `aogpt serve` with its defaults, whose output nobody reads, then SIGTERM under that
load. Judged on correctness and liveness, not speed (a busy CI machine is slow, never stuck): the
strict figures (/health p99 under 100 ms, progress at least every 2 s) are the benchmark's, run on a
quiet machine (docs/serve.md). Memory is not judged here: in half a minute on a busy machine the
server is still warming up (its allocator and oneDNN's kernel cache grow for minutes), so only the
ten-minute benchmark can tell growth from warm-up."""

from __future__ import annotations

import pytest

from aogpt.bench.serve.load import Workload
from aogpt.bench.serve.soak import soak, to_markdown
from tests.serve.conftest import save_run, slow_loaded


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory):
    """A random model of the quickstart's size (bytes tokenizer) saved as a run."""
    return save_run(slow_loaded(), tmp_path_factory.mktemp("soak") / "slow")


@pytest.mark.slow
def test_half_a_minute_of_mixed_load_then_sigterm(slow_checkpoint, tmp_path):
    s = soak(slow_checkpoint, clients=32, seconds=30, threads=1, seed=0, out=tmp_path, workload=Workload(seeds=4))
    report = to_markdown(s)
    assert s["sent_before_signal"] > 100 and s["answered_200"] > 50, report
    assert s["unanswered_count"] == 0, report  # every request answered: 200, 4xx or 503
    assert s["server_errors"] == 0 and s["malformed_not_400"] == 0 and s["well_formed_4xx"] == 0, report
    assert s["late"] == 0, report  # within its deadline (plus 3 s for the client's clock)
    assert s["different_from_generate"] == 0 and s["compared_with_generate"] == s["answered_200"], report
    assert s["cut_streams"] > 0 and s["rejected_400"] > 0, report  # the mix had its faults
    assert s["health_unanswered"] == 0 and s["health_max"] < 5, report
    assert s["longest_stall_engine"] < 10, report  # never stuck (a busy machine may be slow)
    assert s["exit_code"] == 0 and s["exit_seconds"] <= 35, report
    assert (tmp_path / "serve-soak.md").exists() and (tmp_path / "serve-soak.json").exists()
