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
