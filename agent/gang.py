"""What a member of a multi-node job needs to find the others: the variables torchrun, DeepSpeed and MPI read,
and a hostfile in the placement's directory.

WORLD_SIZE counts processes as torchrun does (members x GPUs per member, one process per GPU); NODE_RANK and
TESSERA_NUM_NODES count nodes. RANK and LOCAL_RANK are per process, so the launcher in the job (torchrun,
deepspeed, mpirun) sets them, not the agent.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.jobspec import Gang, JobSpec

HOSTFILE = "hostfile"


def hostfile_text(gang: Gang) -> str:
    """One `<address> slots=<GPUs>` line per member, in rank order (DeepSpeed's and Open MPI's form)."""
    return "".join(f"{m.address} slots={m.slots}\n" for m in gang.members)


def write_hostfile(gang: Gang, job_dir: Path) -> Path:
    """The gang's hostfile in the placement's directory, readable by the job whatever user it runs as (the
    directory keeps other users out: agent/isolation.py)."""
    hostfile = job_dir / HOSTFILE
    tmp = hostfile.with_suffix(".tmp")
    tmp.write_text(hostfile_text(gang))
    os.chmod(tmp, 0o644)
    os.replace(tmp, hostfile)
    return hostfile


def gang_env(spec: JobSpec, job_dir: Path) -> dict[str, str]:
    """Write the gang's hostfile into the placement's directory and return the environment naming it, with the
    rendezvous variables. Nothing for a job of one node."""
    gang = spec.gang
    if gang is None:
        return {}
    hostfile = write_hostfile(gang, job_dir)
    master, me = gang.members[0], gang.members[gang.rank]
    values = {
        "MASTER_ADDR": master.address,
        "MASTER_PORT": str(gang.master_port),
        "WORLD_SIZE": str(sum(m.slots for m in gang.members)),
        "NODE_RANK": str(gang.rank),
        "LOCAL_WORLD_SIZE": str(me.slots),
        "TESSERA_NUM_NODES": str(len(gang.members)),
        "TESSERA_NODELIST": ",".join(m.node for m in gang.members),
        "TESSERA_HOSTFILE": str(hostfile),
    }
    # torchrun takes each of its flags from PET_<FLAG> when the flag is not given: a bare `torchrun train.py`
    # joins the gang.
    values.update(
        {
            "PET_NNODES": values["TESSERA_NUM_NODES"],
            "PET_NODE_RANK": values["NODE_RANK"],
            "PET_NPROC_PER_NODE": values["LOCAL_WORLD_SIZE"],
            "PET_MASTER_ADDR": values["MASTER_ADDR"],
            "PET_MASTER_PORT": values["MASTER_PORT"],
        }
    )
    return values
