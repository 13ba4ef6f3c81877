"""XProf 2.24's memory viewer on an HloProto: the oracle the memory tests compare against.

memory_viewer reads `<module>.hlo_proto.pb` beside an xplane file, so we lay the dump out that way
in a scratch folder with an empty XSpace.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def memory_viewer(hlo_pb: Path, scratch: Path) -> dict:
    from xprof.convert import raw_to_tool_data

    from tpuprof import protos

    scratch.mkdir(parents=True, exist_ok=True)
    module = "module_under_test"
    shutil.copy(hlo_pb, scratch / f"{module}.hlo_proto.pb")
    xplane = scratch / "host.xplane.pb"
    xplane.write_bytes(protos.xplane_pb2().XSpace().SerializeToString())
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "memory_viewer", {"module_name": module})
    return json.loads(data)


def tool_data(xplane: Path, tool: str, scratch: Path, options: dict | None = None):
    """XProf 2.24's TOOL (overview_page, roofline_model, op_profile...) on a copy of XPLANE in SCRATCH (XProf
    writes its cache files beside the capture it reads), parsed from JSON."""
    from xprof.convert import raw_to_tool_data

    scratch.mkdir(parents=True, exist_ok=True)
    copy = scratch / xplane.name
    if not copy.exists():
        shutil.copy(xplane, copy)
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], tool, options or {})
    return json.loads(data)


def roofline_rows(roofline_model: list) -> list[dict]:
    """roofline_model's per-op rows over the whole capture (step "Total", infeed/outfeed included)."""
    table = roofline_model[0]
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, (c.get("v") for c in row["c"]))) for row in table["rows"]]
    return [r for r in rows if r["step"] == "Total" and r["include_infeed_outfeed"] and r["category"] != "Program"]
