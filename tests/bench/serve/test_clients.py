"""`aogpt bench serve --quick`: a real server, clients, the soak, and what the report says."""

from __future__ import annotations

import json


def test_bench_serve_quick(cli, tiny_run, tmp_path):
    result = cli("bench", "serve", "--checkpoint", str(tiny_run), "--quick", "--duration", "1", "--out",
                 str(tmp_path), "--no-progress", "--json", "--threads", "1")
    assert result.code == 0, result.err
    summary = json.loads(result.out.strip().splitlines()[-1])
    rows = summary["rows"]
    for mode in ("one", "many"):
        assert rows[mode]["answered"] == rows[mode]["requests"] == 6
        assert rows[mode]["identical_to_generate"] == 1.0 and rows[mode]["identical_to_one_at_a_time"] == 1.0
        assert rows[mode]["p50_latency"] <= rows[mode]["p99_latency"]
        assert rows[mode]["cpu_seconds"] > 0
    # generate() on the same requests 3 at a time (one seed per sample): the same answers
    assert rows["batch"]["requests"] == 6 and rows["batch"]["identical_to_generate"] == 1.0
    assert rows["batch"]["cpu_seconds"] > 0 and rows["generate"]["cpu_seconds"] > 0
    assert summary["versus_batch"] == rows["many"]["wall_seconds"] / rows["batch"]["wall_seconds"]
    assert set(summary["goals"]) == {"3 concurrent at least 4x one at a time",
                                     "3 concurrent within 1.25x of generate() 3 at a time",
                                     "outputs identical to generate()"}
    assert summary["goals"]["outputs identical to generate()"]
    assert "attention" in summary["decode_kernels"]["server"] and "attention" in summary["decode_kernels"]["in_process"]
    soak = summary["soak"]
    assert soak["sent"] > 0 and soak["lost"] == soak["duplicated"] == soak["different_from_generate"] == 0
    table = (tmp_path / "serve.md").read_text()
    assert "server, 3 concurrent clients" in table and "Soak: 3 clients" in table
    assert "generate() on the same requests, 3 at a time" in table and "Goals: " in table
    assert "Decode kernels" in table
    assert json.loads((tmp_path / "serve.json").read_text())["clients"] == 3
