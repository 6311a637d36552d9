"""The process group of a training script under torchrun, on however many GPUs there are.

A GPU per rank where there are enough: an NCCL group, its communicator made at once
(`device_id`), so that lowbit's collectives can borrow it when the hook is created. With
fewer GPUs than ranks, rank r runs on cuda:(r % GPUs): several ranks share a GPU, the
group is gloo (NCCL refuses two ranks on one GPU) and lowbit's collectives run on their
node backend (CUDA IPC between the rank processes, bootstrapped over the group's Store).
On the CPU the group is gloo."""

import torch
import torch.distributed as dist


def init_group(rank: int, local: int, world: int, cuda: bool) -> torch.device:
    """Initialise the default process group; the device this rank computes on."""
    if not cuda:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        return torch.device("cpu")
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise SystemExit("a run on CUDA, but no CUDA device is visible")
    device = torch.device("cuda", local % gpus)
    torch.cuda.set_device(device)
    if gpus >= world:
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    return device
