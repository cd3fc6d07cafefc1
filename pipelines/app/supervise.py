"""The job's controller: ``python -m pipelines.app.supervise [options] -- <launch command>``.

Runs the launch command (``torchrun ... -m pipelines.app.train ...``, ``bash scripts/train.sh
...``) and decides from its exit and its ``HOLD.json`` (``pipelines.holds``) what next:

- finished (exit 0, no hold): stop, exit 0;
- ``error`` hold: print it and stop with exit code 3 (retrying cannot help);
- ``data`` hold: poll for the paths it waits for, backing off from ``--poll-seconds`` to
  ``--poll-max-seconds``, then relaunch (the job resumes from its checkpoint); exit 4 if
  ``--max-wait-seconds`` pass first;
- ``preempted`` hold: relaunch with ``--relaunch-preempted``, else stop with exit 0 (the
  scheduler requeues the job);
- a crash (non-zero exit, no hold: a killed rank, a lost node): relaunch up to
  ``--max-restarts`` times, else stop with its exit code.

A SIGTERM or SIGINT to the supervisor goes to the job (which saves and stops) and ends
the supervision. ``--once`` runs the command once and only translates its outcome into
the exit code above (torchrun itself exits 1 whatever its workers' codes were): the
torchx component and ``scripts/train.sh`` run the job so. Every decision is logged to
stderr, and as JSON lines to ``--log`` when given.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, List, Optional

from pipelines.holds import EXIT_DATA_HOLD, EXIT_ERROR_HOLD, HOLD_FILE, clear_hold, read_hold


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.child: Optional[subprocess.Popen] = None
        self.stop_requested = False

    def log(self, decision: str, **details: Any) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "decision": decision, **details}
        print(f"[supervise] {record['time']} {decision} " + json.dumps(details), file=sys.stderr, flush=True)
        if self.args.log:
            with open(self.args.log, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _forward(self, signum: int, frame: Any) -> None:
        self.stop_requested = True
        if self.child is not None and self.child.poll() is None:
            self.log("forwarding signal", signal=signal.Signals(signum).name)
            os.killpg(self.child.pid, signum)

    def launch(self, attempt: int) -> int:
        clear_hold(self.args.run_dir)
        self.log("launch", attempt=attempt, command=self.args.command)
        # Its own process group, so a forwarded signal reaches torchrun and every worker.
        self.child = subprocess.Popen(self.args.command, start_new_session=True)
        code = self.child.wait()
        self.child = None
        return code

    def wait_for(self, paths: List[str]) -> bool:
        """Polls until every path exists, backing off; False if the wait timed out or
        the supervisor was asked to stop."""
        delay, waited = self.args.poll_seconds, 0.0
        while not self.stop_requested:
            missing = [p for p in paths if not os.path.exists(p)]
            if not missing:
                return True
            if self.args.max_wait_seconds and waited >= self.args.max_wait_seconds:
                self.log("gave up waiting for data", missing=missing, waited_s=round(waited, 1))
                return False
            self.log("waiting for data", missing=missing, next_poll_s=delay)
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, self.args.poll_max_seconds)
        return False

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._supervise()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _supervise(self) -> int:
        attempt, restarts = 1, 0
        while True:
            code = self.launch(attempt)
            hold = read_hold(self.args.run_dir)
            kind = hold["kind"] if hold else None
            self.log("exited", code=code, hold=kind)
            if kind == "error":
                print(json.dumps(hold, indent=2), flush=True)
                self.log("stop: permanent error, not relaunching", reason=hold["reason"], step=hold["step"],
                         last_good_checkpoint=hold["last_good_checkpoint"])  # fmt: skip
                return EXIT_ERROR_HOLD
            if self.stop_requested or self.args.once:
                return {"data": EXIT_DATA_HOLD, "preempted": 0}.get(kind, code)
            if kind == "data":
                if not self.wait_for(hold["waiting_for"]):
                    return EXIT_DATA_HOLD
                self.log("data ready: relaunching", waited_for=hold["waiting_for"])
            elif kind == "preempted":
                if not self.args.relaunch_preempted:
                    self.log("stop: pre-empted (--relaunch-preempted relaunches)", step=hold["step"])
                    return 0
                self.log("pre-empted: relaunching", step=hold["step"])
            elif code == 0:
                self.log("stop: finished")
                return 0
            elif restarts < self.args.max_restarts:
                restarts += 1
                self.log("crashed: relaunching", code=code, restart=restarts, of=self.args.max_restarts)
                time.sleep(self.args.poll_seconds)
            else:
                self.log("stop: crashed", code=code, restarts=restarts)
                return code
            attempt += 1


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines.app.supervise", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [options] -- <launch command>")  # fmt: skip
    parser.add_argument("--run-dir", default=".", help=f"where the job writes {HOLD_FILE} (its working directory)")
    parser.add_argument("--once", action="store_true", help="run once; only translate the outcome into the exit code")
    parser.add_argument("--relaunch-preempted", action="store_true", help="relaunch after a pre-emption")
    parser.add_argument("--max-restarts", type=int, default=0, help="relaunches after crashes (no hold)")
    parser.add_argument("--poll-seconds", type=float, default=30.0, help="first wait between data polls")
    parser.add_argument("--poll-max-seconds", type=float, default=600.0, help="longest wait between data polls")
    parser.add_argument("--max-wait-seconds", type=float, default=0.0, help="give up waiting for data (0: never)")
    parser.add_argument("--log", default=None, help="append every decision to this file as JSON lines")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("command: give the launch command after --")
    for name in ("max_restarts", "poll_seconds", "poll_max_seconds", "max_wait_seconds"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}: must be >= 0")
    if args.poll_seconds <= 0 and not args.once:
        parser.error("--poll-seconds: must be > 0")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    return Supervisor(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
