"""`tpuprof capture`: check the options -> resolve where to capture -> check it answers -> trace all hosts in
one call -> publish the run folder -> summary or JSON (and, with --analyze, `tpuprof analyze` on the new run).

`tpuprof.capture()` runs the same steps without the status line and the live progress."""

from __future__ import annotations

from typing import Callable, Optional

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

    options = trace_options(duration, attempts, delay, host_tracer_level, device_tracer_level, python_tracer_level,
                            port)
    target = resolve(options, service_addr=service_addr, tpu=tpu, zone=zone, project=project, port=port)
    notes = f"; {'; '.join(target.notes)}" if target.notes else ""
    render.say(f"tpuprof: capturing {', '.join(target.addresses)}. {target.why}{notes}.")

    progress = render.LiveProgress(target.addresses, options)
    saved = []

    def published(run_: capturing.CapturedRun) -> None:
        """The run is in place: say so before the analysis starts, so that an interrupted analysis still names it."""
        saved.append(run_)
        progress.stop()
        if not as_json:
            render.print_summary(run_, target, options)

    try:
        captured = result(target, logdir, options, analyze=analyze, on_start=progress.start, on_captured=published)
    except KeyboardInterrupt:
        if saved and as_json:  # the summary is not printed with --json: name the run the capture left
            render.say(f"tpuprof: the run is saved in {saved[0].run_dir}; its analysis was interrupted.")
        raise
    finally:
        progress.stop()
    if as_json:  # the analysis, or why there is none, joins the document: stdout stays one JSON document
        from tpuprof.renderers.output import print_json

        print_json(captured.to_dict())
        return
    if captured.analysis_error is not None:  # the capture is saved all the same
        raise UserError(captured.analysis_error)
    if captured.analysis is not None:
        from tpuprof.renderers import analyze as analyze_render

        analyze_render.print_document(captured.analysis.to_dict(), captured.analysis.top)


def trace_options(duration: str = "3s", attempts: int = 3, delay: str = "0ms", host_tracer_level: int = 2,
                  device_tracer_level: int = 1, python_tracer_level: int = 0,
                  port: Optional[int] = None) -> capturing.TraceOptions:
    """The tracing options, checked before anything is contacted."""
    if attempts < 1:
        raise UserError("--attempts must be at least 1.")
    for name, value, allowed in (("--host-tracer-level", host_tracer_level, (0, 1, 2, 3)),
                                 ("--device-tracer-level", device_tracer_level, (0, 1)),
                                 ("--python-tracer-level", python_tracer_level, (0, 1))):
        if value not in allowed:
            raise UserError(f"{name} must be one of {', '.join(map(str, allowed))}, not {value}.")
    if port is not None and not 0 < port < 65536:
        raise UserError(f"--port {port} is not a TCP port (1-65535).")
    return capturing.TraceOptions(
        duration_ms=capturing.parse_duration_ms(duration),
        attempts=attempts,
        delay_ms=capturing.parse_duration_ms(delay, allow_zero=True),
        host_tracer_level=host_tracer_level,
        device_tracer_level=device_tracer_level,
        python_tracer_level=python_tracer_level,
    )


def resolve(options: capturing.TraceOptions, service_addr: Optional[str] = None, tpu: Optional[str] = None,
            zone: Optional[str] = None, project: Optional[str] = None,
            port: Optional[int] = None) -> addressing.ProfilerAddresses:
    """The profiler addresses (and why those), each checked to answer."""
    target = addressing.resolve(service_addr=service_addr, tpu=tpu, zone=zone, project=project, port=port)
    addressing.check_reachable(target.addresses, attempts=options.attempts, why=target.why)
    return target


def result(target: addressing.ProfilerAddresses, logdir: str, options: capturing.TraceOptions, analyze: bool = False,
           on_start: Optional[Callable] = None, on_captured: Optional[Callable] = None):
    """Trace every address in one client call and publish the run under LOGDIR (never overwriting one); with
    ANALYZE, the new run through the analyze pipeline. The typed result `tpuprof.capture()` returns.
    `on_captured(run)` is called once the run is published, before the analysis."""
    from tpuprof.results import CaptureResult

    run_ = capturing.capture(target.addresses, logdir, options, tpu_master=target.tpu_master, on_start=on_start)
    if on_captured:
        on_captured(run_)
    analysis, error = None, None
    if analyze and not run_.hosts and run_.elsewhere and not capturing.is_remote(run_.logdir):
        error = (f"the traces are on the other machines ({', '.join(h.address for h in run_.elsewhere)}): fetch "
                 "them as shown, then run tpuprof analyze on the logdir.")
    elif analyze:
        from tpuprof.commands import analyze as analyze_command

        try:
            analysis = analyze_command.result(run_.run_dir, top=10)
        except UserError as why:  # the capture is saved and worth reporting even if it cannot be analysed
            error = str(why)
    return CaptureResult(run_, target, options, analysis, error)
