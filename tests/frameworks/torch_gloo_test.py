"""One process of a PyTorch program as a command job's `per_device` process runs it: plain
torch.distributed over Gloo, its rank, the world size and the rendezvous (MASTER_ADDR,
MASTER_PORT) read from the environment (init_method="env://"). An all-reduce (sum) of a tensor
where rank r contributes r + 1 must give 1 + 2 + ... + world size in every process. And torch's
BLAS must be OpenBLAS: Debian's torch calls BLAS through libblas.so.3, which is the reference
BLAS unless libopenblas0-pthread is installed (about 10 times slower; nothing else says so), so
the library that torch's sgemm_ resolves to must be OpenBLAS's. Argument: the test's directory
(unused here: named so that the test finds any process left behind). Exits 0 and prints
"OK ..." when both hold.
"""
import ctypes
import datetime
import os

import torch
import torch.distributed as dist


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def mapped(name):
    """The paths of the libraries mapped into this process whose file name contains `name`."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if len(line.split()) >= 6}
    return sorted(p for p in paths if name in os.path.basename(p))


def torch_sgemm_library():
    """The file of the sgemm_ that torch's matrix products call: the symbol as the dynamic
    linker resolves it from libtorch_cpu. Not merely a mapped OpenBLAS: OpenBLAS's LAPACK can be
    mapped beside the reference BLAS, whose sgemm_ then wins."""
    torch_cpu = mapped("libtorch_cpu")
    if not torch_cpu:
        raise SystemExit("libtorch_cpu is not mapped: is this Debian's python3-torch?")
    handle = ctypes.CDLL(torch_cpu[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    info = DlInfo()
    if not ctypes.CDLL(None).dladdr(ctypes.cast(handle.sgemm_, ctypes.c_void_p), ctypes.byref(info)):
        raise SystemExit("dladdr found no library for torch's sgemm_")
    return os.path.realpath(info.dli_fname.decode())


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"process {rank} of {world}"
    blas = torch_sgemm_library()
    if "openblas" not in blas:
        raise SystemExit(f"{where}: torch's sgemm_ is {blas}, not OpenBLAS (mapped BLAS "
                         f"libraries: {mapped('blas')}): install libopenblas0-pthread, check "
                         "`update-alternatives --display libblas.so.3-x86_64-linux-gnu` and "
                         "LD_LIBRARY_PATH")

    dist.init_process_group(backend="gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    if dist.get_rank() != rank or dist.get_world_size() != world:
        raise SystemExit(f"{where}: torch.distributed says rank {dist.get_rank()} of "
                         f"{dist.get_world_size()}")
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    want = world * (world + 1) / 2
    if not torch.all(t == want):
        raise SystemExit(f"{where}: all_reduce gave {t[:4].tolist()}..., want {want}")
    dist.destroy_process_group()
    print(f"OK {where}: all_reduce over {world} processes = {want} (torch {torch.__version__}, "
          f"sgemm_ from {blas})", flush=True)


if __name__ == "__main__":
    main()
