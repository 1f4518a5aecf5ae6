"""A job for test_forked.py: each rank prints torchrun's variables; rank 1
exits with the status given while rank 0 sleeps a minute (with status 0 both
meet in a barrier)."""

import os
import sys
import time

import torch.distributed as dist

if __name__ == "__main__":
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")
    print(" ".join(f"{k}={os.environ.get(k)}" for k in keys), f"argv={sys.argv[1:]}", f"cwd={os.getcwd()}", flush=True)
    status = int(sys.argv[1])
    dist.init_process_group("gloo")
    if status:
        if dist.get_rank() == 1:
            sys.exit(status)
        time.sleep(60)
    dist.barrier()
    dist.destroy_process_group()
