"""`tpuprof trace PROFILE -o trace.pftrace [--steps 10:13] [--hosts h1,h2]`: chosen steps of every host and TPU core
as a Perfetto trace (protobuf), for ui.perfetto.dev.

Two streamed passes per host file, each in bounded memory (sources.xspace_stream): the step analysis `tpuprof
analyze` runs (steps.host_profile_of_file), which gives the steps and so the time window; then the window's events
(renderers.trace). The window is the chosen steps, on the host and every TPU core; by default the median step
(by duration, on the first host) and one either side.

The output is written to a temporary file beside it and renamed: an interrupted export leaves nothing, and an
existing file is replaced only with --force. Exit 2 on bad input (one sentence).
"""

from __future__ import annotations

from pathlib import Path

from tpuprof.errors import UserError

DEFAULT_STEPS_AROUND_MEDIAN = 1


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """'10:13' -> (10, 13), steps 10, 11 and 12 (as Python slices); '12' -> (12, 13); None: the default window."""
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        low = int(first)
        high = int(last) if sep else low + 1
    except ValueError:
        raise UserError(f"--steps takes FIRST:END step numbers, e.g. 10:13 (steps 10 to 12), or one number "
                        f"(got {text!r}).") from None
    if low < 0 or high <= low:
        raise UserError(f"--steps {text}: give FIRST:END with END > FIRST >= 0 (10:13 is steps 10, 11, 12).")
    return low, high


def choose_hosts(files: list[str], hosts: str | None) -> list[str]:
    from tpuprof.sources import xplane

    if not hosts:
        return files
    wanted = [h.strip() for h in hosts.split(",") if h.strip()]
    names = {xplane.host_name(f): f for f in files}
    missing = [h for h in wanted if h not in names]
    if missing:
        raise UserError(f"no host {', '.join(missing)} in the capture; it has {', '.join(sorted(names))}.")
    return [names[h] for h in wanted]


def choose_steps(steps, asked: tuple[int, int] | None) -> list:
    """The steps to export, consecutive in time: steps FIRST to END-1 by number (the first such run when numbers
    repeat, as in captures of restarted loops), or the median step by duration and one either side."""
    ordered = sorted(steps, key=lambda s: s.start_ps)
    if asked is None:
        by_duration = sorted(range(len(ordered)), key=lambda i: (ordered[i].duration_ps, i))
        middle = by_duration[(len(by_duration) - 1) // 2]
        return ordered[max(0, middle - DEFAULT_STEPS_AROUND_MEDIAN):middle + DEFAULT_STEPS_AROUND_MEDIAN + 1]
    low, high = asked
    first = next((i for i, s in enumerate(ordered) if low <= s.number < high), None)
    if first is None:
        return []
    chosen = []
    for step in ordered[first:]:
        if not low <= step.number < high or any(c.number == step.number for c in chosen):
            break
        chosen.append(step)
    return chosen


def window(profile, chosen: list) -> tuple[int, int]:
    """[start, end) in ps of the chosen host steps, widened to the same steps on every TPU core (each core's
    step of that number nearest in time)."""
    start = min(s.start_ps for s in chosen)
    end = max(s.start_ps + s.duration_ps for s in chosen)
    for device in profile.devices:
        for nearest in _same_steps(device.steps, chosen):
            start, end = min(start, nearest.start_ps), max(end, nearest.start_ps + nearest.duration_ps)
    return start, end


def _same_steps(steps, chosen: list) -> list:
    """For each chosen step, the step of STEPS with its number nearest to it in time (another host or a core)."""
    found = []
    for step in chosen:
        same = [s for s in steps if s.number == step.number]
        if same:
            found.append(min(same, key=lambda s: abs(s.start_ps - step.start_ps)))
    return found


def export(path: str, output: Path, steps: str | None = None, hosts: str | None = None,
           force: bool = False):
    """The trace written to OUTPUT and what it holds, as a TraceResult (the --json document)."""
    from tpuprof.analyses import steps as analysis
    from tpuprof.results import TraceResult
    from tpuprof.renderers.output import atomic_file, output_file
    from tpuprof.renderers.perfetto import Writer
    from tpuprof.renderers.trace import HostTrace
    from tpuprof.sources import inputs, xplane

    output = Path(output)
    asked = parse_steps(steps)
    written = output_file(output, force, "steps.pftrace")  # a symlink's target; refused: not a regular file
    inputs.expect(path, inputs.STEPS)
    files, chosen_run = xplane.find_capture(path)
    files = choose_hosts(files, hosts)
    profiles = [analysis.host_profile_of_file(f) for f in files]  # the step analysis of `tpuprof analyze`
    first = next((p for p in profiles if p.steps), None)
    if first is None:
        raise UserError(f"no steps found in {path}: `tpuprof analyze` says why; a trace needs steps to pick.")
    chosen = choose_steps(first.steps, asked)
    if not chosen:
        numbers = sorted(s.number for s in first.steps)
        raise UserError(f"--steps {steps}: the capture holds steps {numbers[0]} to {numbers[-1]}.")
    numbers = [s.number for s in chosen]
    events, spans = 0, []
    output_file(output, force, "steps.pftrace")  # the path may have changed while the capture was read
    with atomic_file(written) as handle:  # a temporary file beside OUTPUT, renamed when complete
        writer = Writer(handle)
        next_pid = 1
        for file, profile in zip(files, profiles):
            # Other hosts: their steps of the same numbers nearest in time to the first host's.
            mine = chosen if profile is first else _same_steps(profile.steps, chosen)
            if not mine:
                continue
            span = window(profile, mine)
            spans.append(span)
            host = HostTrace(writer, xplane.host_name(file), span, set(numbers), next_pid)
            with xplane.open_stream(file) as space:
                host.write(space, profile)
            next_pid, events = host.next_pid, events + host.events
    window_ms = max((end - start) / 1e9 for start, end in spans) if spans else 0.0
    run = None if chosen_run is None else {"name": chosen_run.name, "folder": chosen_run.folder,
                                           "other_runs": chosen_run.others}
    return TraceResult(str(output), output.stat().st_size, [xplane.host_name(f) for f in files], numbers, events,
                       round(window_ms, 3), run=run)


def run(path: str, output: Path, steps: str | None, hosts: str | None, force: bool, as_json: bool = False) -> None:
    done = export(path, output, steps, hosts, force)
    if as_json:
        from tpuprof.renderers.output import print_json

        print_json(done.to_dict())
        return
    from tpuprof.renderers.trace import print_summary

    print_summary(done)
