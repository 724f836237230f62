"""The multi-host flags shared by `dpsynth pretrain` and `dpsynth dp-tune` (docs/models.md).

    --distributed                       join the other processes (jax.distributed)
    --coordinator-address HOST:PORT     process 0's address   } all three, or none of them
    --num-processes N                   how many processes    } (auto-detected on Cloud TPU
    --process-id I                      this one, 0..N-1      }  VMs, SLURM, Open MPI)
"""

from __future__ import annotations

import argparse

from dpsynth.train.sharding import DistributedError, initialize_distributed


def add_flags(p: argparse.ArgumentParser) -> None:
    """Adds the four flags above to a trainer's parser."""
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: join the other processes first (jax.distributed.initialize)")
    p.add_argument("--coordinator-address", default=None, metavar="HOST:PORT",
                   help="with --distributed: process 0's address (default: auto-detected on TPU VMs, SLURM, Open MPI)")
    p.add_argument("--num-processes", type=int, default=None, metavar="N", help="with --distributed: process count")
    p.add_argument("--process-id", type=int, default=None, metavar="I", help="with --distributed: this process, 0..N-1")


def start(args: argparse.Namespace) -> None:
    """Joins the processes when `--distributed` is given. Raises `DistributedError` on a bad combination."""
    if args.distributed:
        initialize_distributed(coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                               process_id=args.process_id)
    elif (args.coordinator_address, args.num_processes, args.process_id) != (None, None, None):
        raise DistributedError("--coordinator-address/--num-processes/--process-id need --distributed")


def is_primary(args: argparse.Namespace) -> bool:
    """Whether this process writes the run's shared files (always, without `--distributed`; after `start`)."""
    if not args.distributed:
        return True
    import jax

    return jax.process_index() == 0
