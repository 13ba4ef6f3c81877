"""`tpuprof capture`: resolve where to capture -> check it answers -> trace all hosts in one call ->
publish the run folder -> summary (and, with --analyze, `tpuprof analyze` on the new run)."""

from __future__ import annotations

from typing import Optional

from tpuprof.errors import UserError
from tpuprof.sources import addresses as addressing
from tpuprof.sources import capture as capturing


def run(
    logdir: str = "logs",
    tpu: Optional[str] = None,
    zone: Optional[str] = None,
    project: Optional[str] = None,
    service_addr: Optional[str] = None,
    port: Optional[int] = None,
    duration: str = "3s",
    attempts: int = 3,
    delay: str = "0ms",
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    python_tracer_level: int = 0,
    analyze: bool = False,
    as_json: bool = False,
) -> None:
    from tpuprof.renderers import capture as render

    if attempts < 1:
        raise UserError("--attempts must be at least 1.")
    for name, value, allowed in (("--host-tracer-level", host_tracer_level, (0, 1, 2, 3)),
                                 ("--device-tracer-level", device_tracer_level, (0, 1)),
                                 ("--python-tracer-level", python_tracer_level, (0, 1))):
        if value not in allowed:
            raise UserError(f"{name} must be one of {', '.join(map(str, allowed))}, not {value}.")
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535).")
    options = capturing.TraceOptions(
        duration_ms=capturing.parse_duration_ms(duration),
        attempts=attempts,
        delay_ms=capturing.parse_duration_ms(delay, allow_zero=True),
        host_tracer_level=host_tracer_level,
        device_tracer_level=device_tracer_level,
        python_tracer_level=python_tracer_level,
    )

    target = addressing.resolve(service_addr=service_addr, tpu=tpu, zone=zone, project=project, port=port)
    addressing.check_reachable(target.addresses, attempts=attempts, why=target.why)
    notes = f"; {'; '.join(target.notes)}" if target.notes else ""
    render.say(f"tpuprof: capturing {', '.join(target.addresses)}. {target.why}{notes}.")

    progress = render.LiveProgress(target.addresses, options)
    try:
        result = capturing.capture(target.addresses, logdir, options, tpu_master=target.tpu_master,
                                   on_start=progress.start)
    finally:
        progress.stop()

    document = render.to_json(result, target, options)
    if analyze:
        analysis = _analyze(result.run_dir, as_json)
        if as_json:
            document["analysis"] = analysis
    if as_json:
        from tpuprof.renderers.output import print_json

        print_json(document)
    else:
        render.print_summary(result, target, options)
        if analyze:
            from tpuprof.commands import analyze as analyze_command

            analyze_command.run(result.run_dir, top=10, as_json=False)


def _analyze(run_dir: str, as_json: bool):
    """--analyze: the new run through `tpuprof analyze`; with --json its document joins ours, so that
    stdout stays one JSON document."""
    if not as_json:
        return None
    from tpuprof.commands import analyze as analyze_command
    from tpuprof.renderers import analyze as analyze_render

    try:
        report = analyze_command.analyze(run_dir, top=10)
    except UserError as error:  # the capture is saved and worth reporting even if it cannot be analysed
        return {"error": str(error)}
    return analyze_render.to_json(report, 10)
