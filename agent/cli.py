"""`tessera-agent`: run the node agent, or check what it sees on this host."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from agent import logformat
from agent.config import AgentConfig, ConfigError, add_arguments, load_config


def _backend(config: AgentConfig):
    from agent.backends import make_backend

    return make_backend(
        config.backend,
        sim_config=config.sim_config,
        node_name=config.node_name,
        sharing_mode=config.sharing,
        sharing_overrides=config.sharing_overrides,
    )


def cmd_run(config: AgentConfig) -> int:
    from agent.containers import report as container_report
    from agent.executor import Executor
    from agent.isolation import Isolation, IsolationError
    from agent.mps import MpsController
    from agent.runtime import Agent
    from agent.transport import WebSocketConnector, run_agent, ws_url

    config.require_portal()
    try:
        isolation = Isolation(mode=config.job_users, uid_pool=config.uid_pool)
    except IsolationError as exc:
        raise ConfigError(str(exc)) from exc
    containers = config.containers()
    if isolation.root:
        # What the agent writes (its state, the jobs' run records and logs) is its own; jobs may only pass
        # through to their own trees (the executor opens those: agent/isolation.py).
        os.umask(0o077)
    config.work_dir.mkdir(parents=True, exist_ok=True)
    logformat.configure(
        level=config.log_level,
        log_format=config.log_format,
        handlers=[logging.StreamHandler(), logging.FileHandler(config.work_dir / "agent.log")],
        node=config.node_name,
    )
    url = ws_url(config.portal_url)
    agent = Agent(
        node_name=config.node_name,
        backend=_backend(config),
        executor=Executor(
            config.work_dir,
            mps=MpsController(config.work_dir, control_path=config.mps_control),
            fence_after_s=config.fence_after_s,
            isolation=isolation,
            containers=containers,
            pull_policy=config.pull_policy,
        ),
        sample_interval_s=config.sample_s,
        heartbeat_s=config.heartbeat_s,
        watchdog_tolerance_mib=config.watchdog_tolerance_mib,
        watchdog_grace_s=config.watchdog_grace_s,
        address=config.address,
    )
    if config.backend == "nvml" and os.environ.get("TESSERA_FAKE_NVML"):
        logging.getLogger("tessera.agent").warning(
            "TESSERA_FAKE_NVML is set: GPU readings come from the recorded fixture, not from this host"
        )
    for what, ok, detail in [*isolation.report(), *container_report(containers)]:
        logging.getLogger("tessera.agent").log(
            logging.INFO if ok else logging.WARNING, "isolation: %s: %s", what, detail
        )
    if config.token_file is not None and config.token_file.stat().st_mode & 0o077:
        logging.getLogger("tessera.agent").warning(
            "the token file %s is readable by others: chmod 600 it (a job that reads it speaks for this node)",
            config.token_file,
        )
    logging.getLogger("tessera.agent").info(
        "node %s: %d GPU(s) via %s, portal %s, work dir %s",
        config.node_name,
        len(agent.inventory.gpus),
        config.backend,
        url,
        config.work_dir,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Jobs keep running when the agent stops: the next agent re-adopts them.
        await run_agent(
            agent, WebSocketConnector(url, token=config.token, node_name=config.node_name), stop=stop
        )

    try:
        asyncio.run(main())
    finally:
        agent.close()
    return 0


def cmd_check(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.check import format_report, gather, job_host_report, mps_smoke
    from agent.containers import report as container_report
    from agent.isolation import Isolation, IsolationError

    work_dir = config.work_dir / "check"
    work_dir.mkdir(parents=True, exist_ok=True)
    backend = _backend(config)
    try:
        report = gather(backend, mps_control=config.mps_control, work_dir=work_dir)
        try:
            isolation = Isolation(mode=config.job_users, uid_pool=config.uid_pool)
            report["isolation"] = [
                {"what": what, "enforced": ok, "detail": detail} for what, ok, detail in isolation.report()
            ]
            report["isolation"] += job_host_report(isolation, work_dir=config.work_dir, reach=args.reach)
            try:
                containers = config.containers()
                report["isolation"] += [
                    {"what": what, "enforced": ok, "detail": detail}
                    for what, ok, detail in container_report(containers)
                ]
            except ConfigError as exc:
                report["isolation"].append({"what": "jobs in images", "enforced": False, "detail": str(exc)})
        except IsolationError as exc:
            report["isolation"] = [{"what": "job users", "enforced": False, "detail": str(exc)}]
        if args.mps_smoke:
            report["mps_smoke"] = mps_smoke(
                backend.inventory(),
                work_dir=work_dir,
                mps_control=config.mps_control,
                gpu_index=args.gpu,
                memory_mib=args.memory_mib,
                compute_pct=args.compute_pct,
            )
    finally:
        backend.close()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    smoke = report.get("mps_smoke")
    return 0 if smoke is None or smoke.get("ok") else 1


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:5432
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. 127.0.0.1:5432 (got {text!r})")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="connect to the portal and run this node's jobs")
    add_arguments(run)
    check = sub.add_parser("check", help="print what the agent sees on this host")
    add_arguments(check, connection=False)
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument(
        "--mps-smoke", action="store_true", help="start one MPS-limited job and report its limits"
    )
    check.add_argument(
        "--reach",
        action="append",
        type=_host_port,
        default=[],
        metavar="HOST:PORT",
        help="also try whether a job's uid can open a TCP connection to HOST:PORT (repeatable; loopback's"
        " PostgreSQL and Redis ports and DATABASE_URL / REDIS_URL are tried anyway)",
    )
    check.add_argument("--gpu", type=int, default=0, help="GPU index for --mps-smoke (0)")
    check.add_argument(
        "--memory-mib", type=int, default=4096, help="pinned memory limit for --mps-smoke (4096)"
    )
    check.add_argument(
        "--compute-pct", type=int, default=25, help="active thread percentage for --mps-smoke (25)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args)
        if args.command == "run":
            return cmd_run(config)
        return cmd_check(config, args)
    except ConfigError as exc:
        print(f"tessera-agent: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        import pynvml

        if isinstance(exc, getattr(pynvml, "NVMLError", ())):
            print(f"tessera-agent: NVML failed: {exc} (no NVIDIA driver? try --backend sim)", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
