"""scripts/port_time.py: where a port's wall time goes, summed from the verdicts and the report of a run folder."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("port_time", ROOT / "scripts" / "port_time.py")
port_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(port_time)


def _verdict(folder, seconds: float, parts: dict | None = None) -> None:
    folder.mkdir(parents=True)
    details = {"seconds": seconds, **({"seconds_in": parts} if parts else {})}
    (folder / "verdict.json").write_text(json.dumps({"gates": [{"gate": "2-correctness", "details": details},
                                                               {"gate": "3-performance", "details": {"seconds": 2.0}}]}))


def test_gate_2_is_split_into_its_parts_and_the_lane_waits_come_from_the_report(tmp_path):
    run = tmp_path / "gemm_tall_k" / "20261207-010000"
    _verdict(run / "baseline", 20.0)  # a verdict from before the split: its gate counts, its parts do not exist
    _verdict(run / "trials" / "0001-block_io-tensor-descriptor", 30.0,
             {"first_calls": 18.0, "calls": 6.0, "oracle": 3.0, "checks": 2.0, "starting": 4.0, "waiting": 9.5})
    (run / "run.json").write_text("{}")
    (run / "report.json").write_text(json.dumps({"shared_device": {"waited_s": 14.5, "wall_s": 120.0}}))
    (row,) = [port_time.run_row(run)]
    assert row["trials"] == 1 and row["correct_s"] == 50.0 and row["timing_s"] == 4.0
    assert (row["first_calls_s"], row["calls_s"], row["oracle_s"], row["waiting_s"]) == (18.0, 6.0, 3.0, 9.5)
    assert row["lane_wait_s"] == 14.5
    (run / "report.json").unlink()  # an unfinished port: no report, no lane figure
    assert port_time.run_row(run)["lane_wait_s"] == 0.0
