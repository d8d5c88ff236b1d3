"""Compile a CUDA source with CuPy (NVRTC) and launch it cooperatively through the driver API.

The launcher keeps one ctypes argument block and one launch configuration per kernel and updates
them in place, so a launch costs one foreign call (a few µs) and allocates nothing. Every driver
call is checked and failures name the call. Imports nothing from this project: `export` embeds
this file in solution.py.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field

import torch

LAUNCH_SYMBOLS = ("launch_threads", "launch_blocks_per_sm", "launch_dynamic_smem", "scratch_bytes", "counter_words")

# A kernel states its launch shape and scratch needs with this macro; the host reads the globals.
LAUNCH_CONTRACT_MACRO = """
#define MK_LAUNCH_CONTRACT(threads, blocks_per_sm, dyn_smem, scratch, counters) \\
  extern "C" __device__ unsigned long long launch_threads = (threads); \\
  extern "C" __device__ unsigned long long launch_blocks_per_sm = (blocks_per_sm); \\
  extern "C" __device__ unsigned long long launch_dynamic_smem = (dyn_smem); \\
  extern "C" __device__ unsigned long long scratch_bytes = (scratch); \\
  extern "C" __device__ unsigned long long counter_words = (counters);
"""

_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
_CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
_CU_FUNC_ATTRIBUTE_NUM_REGS = 4
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
_CUDA_ERROR_OUT_OF_MEMORY = 2
_CUDA_ERROR_NOT_FOUND = 500   # cuModuleGetGlobal: no such symbol
CONTRACT_MEMORY_LIMIT = 1 << 30   # bytes of scratch and counters a kernel may ask its binding for (the seeds: ~25 MB)
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig: grid, block, dynamic shared memory, stream and the attribute list."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


class CudaOutOfMemory(CudaError):
    """A driver call ran out of device memory: the GPU's state (what else is allocated), not the call's input."""


class KernelContractError(RuntimeError):
    """What a kernel declares about itself (launch shape, parameter ABI, weight layout) cannot be honoured: the
    kernel's own failure, found when it is first set up to run."""


class _Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.check(self.lib.cuInit(0), "cuInit")   # idempotent; a first driver call may come before any runtime one
        # cuLaunchKernelEx with the cooperative attribute, not cuLaunchCooperativeKernel: the same
        # launch, ~3 µs less host time per call on the H200 hosts (kimi_host_cost.py --apis: 6.3 vs 9.0)
        # Unprototyped on purpose: callers pass four prebuilt ctypes objects (c_void_p or None, never
        # Python ints, which would be truncated to C int), so ctypes converts nothing (~0.2 µs a call).
        launch = self.lib.cuLaunchKernelEx
        launch.restype = ctypes.c_int
        self.launch = launch

    def error_name(self, status: int) -> str:
        """The driver's name of an error status, with its number."""
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(status, ctypes.byref(name))
        return f"{(name.value or b'?').decode()} ({status})"

    def check(self, status: int, what: str) -> None:
        if status != 0:
            error = CudaOutOfMemory if status == _CUDA_ERROR_OUT_OF_MEMORY else CudaError
            raise error(f"{what} failed: {self.error_name(status)}")

    def occupancy(self, func: int, threads: int, dyn_smem: int) -> int:
        blocks = ctypes.c_int()
        self.check(
            self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(blocks), ctypes.c_void_p(func), ctypes.c_int(threads), ctypes.c_size_t(dyn_smem)
            ),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )
        return blocks.value

    def set_max_dynamic_smem(self, func: int, nbytes: int) -> None:
        self.check(
            self.lib.cuFuncSetAttribute(
                ctypes.c_void_p(func), _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(nbytes)
            ),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        )

    def function_attribute(self, func: int, attribute: int) -> int:
        value = ctypes.c_int()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, ctypes.c_void_p(func)),
                   f"cuFuncGetAttribute({attribute})")
        return value.value

    def make_context_current(self) -> None:
        """Make the current device's primary context (the one torch and CuPy use) current on this thread when no
        context is: a driver call such as cuModuleLoadData needs one, and a process may load before any launch."""
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if ctx.value:
            return
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def sm_count(self) -> int:
        return self.device_attribute(_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT")

    def max_block_smem(self) -> int:
        """The most shared memory, static and dynamic together, one block may opt in to on this device."""
        return self.device_attribute(_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                     "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")

    def device_attribute(self, attribute: int, name: str) -> int:
        dev, value = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, dev), f"cuDeviceGetAttribute({name})")
        return value.value


_driver: _Driver | None = None


def driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


@dataclass
class LaunchContract:
    """What a kernel declares about its own launch (read from its `launch_*` device globals)."""

    threads: int
    blocks_per_sm: int
    dynamic_smem: int
    scratch_bytes: int
    counter_words: int

    def check_memory(self) -> None:
        """KernelContractError if the buffers the kernel asks for exceed CONTRACT_MEMORY_LIMIT: a binding
        allocates them anew for each kernel it runs, so a kernel that took most of the GPU's memory would make
        the next kernel's allocation fail, and that kernel would be blamed."""
        asked = self.scratch_bytes + 4 * self.counter_words
        if asked > CONTRACT_MEMORY_LIMIT:
            raise KernelContractError(
                f"the kernel asks for {self.scratch_bytes} bytes of scratch and {self.counter_words} counter words "
                f"({asked} bytes); at most {CONTRACT_MEMORY_LIMIT} bytes are allowed")


class CubinModule:
    """One load of a cubin through the driver: a module of its own, unloaded when this object goes (after the
    caller's last launch of it has finished: the caller synchronizes first). Loads that are alive together lie
    apart, so two of them are two code placements (the timing rotates over several, each kept loaded: where a
    module's code lies moved the Kimi step by up to 1.3 %, BENCHMARKS.md, forty-seventh session)."""

    def __init__(self, image: bytes):
        self._drv = driver()
        self._drv.make_context_current()
        handle = ctypes.c_void_p()
        self._drv.check(self._drv.lib.cuModuleLoadData(ctypes.byref(handle), ctypes.c_char_p(image)),
                        "cuModuleLoadData")
        self.handle = handle.value

    def function(self, name: str) -> int:
        func = ctypes.c_void_p()
        self._drv.check(self._drv.lib.cuModuleGetFunction(ctypes.byref(func), ctypes.c_void_p(self.handle),
                                                          name.encode()), f"cuModuleGetFunction({name})")
        return func.value

    def read_u64(self, symbol: str) -> int | None:
        """The 64-bit device global `symbol`, or None if the module has none."""
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        status = self._drv.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size),
                                                    ctypes.c_void_p(self.handle), symbol.encode())
        if status == _CUDA_ERROR_NOT_FOUND:
            return None
        self._drv.check(status, f"cuModuleGetGlobal({symbol})")
        if size.value != 8:
            raise KernelContractError(f"the kernel's device global {symbol} is {size.value} bytes, not a 64-bit value")
        value = ctypes.c_uint64()
        self._drv.check(self._drv.lib.cuMemcpyDtoH_v2(ctypes.byref(value), ptr, ctypes.c_size_t(8)),
                        f"cuMemcpyDtoH({symbol})")
        return value.value

    def __del__(self):
        if getattr(self, "handle", None):
            self._drv.lib.cuModuleUnload(ctypes.c_void_p(self.handle))


class _CompiledModule:
    """A module CuPy compiled and loaded (NVRTC), seen as a CubinModule is: its function and its globals."""

    def __init__(self, raw):
        self.raw = raw

    def function(self, name: str) -> int:
        return int(self.raw.get_function(name).kernel.ptr)

    def read_u64(self, symbol: str) -> int | None:
        import cupy
        import numpy

        try:
            ptr = self.raw.get_global(symbol)
        except cupy.cuda.driver.CUDADriverError as e:
            if e.status != _CUDA_ERROR_NOT_FOUND:
                raise
            return None
        return int(cupy.ndarray((1,), dtype=numpy.uint64, memptr=ptr).get()[0])


@dataclass
class CompiledKernel:
    """A loaded kernel: its module, function handle, resources and declared launch contract."""

    module: CubinModule | _CompiledModule
    handle: int
    contract: LaunchContract
    registers: int
    local_bytes: int
    static_smem: int
    max_threads: int
    declared: dict[str, int] = field(default_factory=dict)   # the task's declarations, as read at load

    def read_u64(self, symbol: str, default: int | None = None) -> int:
        """The kernel's 64-bit device global `symbol`; `default` if the kernel has none (else an error)."""
        value = self.module.read_u64(symbol)
        if value is None:
            if default is None:
                raise KernelContractError(f"the kernel has no device global {symbol}")
            return default
        return value


def compile_kernel(source: str, entry: str, options: tuple[str, ...],
                   declarations: list[str] | tuple[str, ...] = ()) -> CompiledKernel:
    """Compile with NVRTC in this process (cooperative groups on), load, and read resources, the launch
    contract and `declarations`. Raises cupy's CompileException (with the compiler log) on a compile error."""
    import cupy

    module = cupy.RawModule(code=source, options=options, enable_cooperative_groups=True)
    module.compile()
    return _loaded(_CompiledModule(module), entry, declarations)


def load_kernel(cubin: bytes, entry: str, declarations: list[str] | tuple[str, ...] = ()) -> CompiledKernel:
    """Load a cubin compiled elsewhere (the sandbox's confined compiler) as a module of its own, and read its
    resources, contract and `declarations`."""
    return _loaded(CubinModule(cubin), entry, declarations)


def _loaded(module: CubinModule | _CompiledModule, entry: str, declarations: list[str] | tuple[str, ...]
            ) -> CompiledKernel:
    handle = module.function(entry)
    drv = driver()
    kernel = CompiledKernel(
        module=module,
        handle=handle,
        contract=LaunchContract(0, 0, 0, 0, 0),
        registers=drv.function_attribute(handle, _CU_FUNC_ATTRIBUTE_NUM_REGS),
        local_bytes=drv.function_attribute(handle, _CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
        static_smem=drv.function_attribute(handle, _CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
        max_threads=drv.function_attribute(handle, _CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
    )
    values = {name: kernel.read_u64(name) for name in LAUNCH_SYMBOLS}
    kernel.declared = {name: kernel.read_u64(name, default=0) for name in declarations}
    kernel.contract = LaunchContract(
        threads=values["launch_threads"],
        blocks_per_sm=values["launch_blocks_per_sm"],
        dynamic_smem=values["launch_dynamic_smem"],
        scratch_bytes=values["scratch_bytes"],
        counter_words=values["counter_words"],
    )
    kernel.contract.check_memory()
    smem = kernel.static_smem + kernel.contract.dynamic_smem
    if smem > drv.max_block_smem():
        raise KernelContractError(f"the kernel asks for {kernel.contract.dynamic_smem} bytes of dynamic shared memory "
                                  f"per block besides {kernel.static_smem} static ({smem}); this GPU allows at most "
                                  f"{drv.max_block_smem()} together")
    if smem > 48 * 1024:   # past the default, a launch needs the opt-in
        drv.set_max_dynamic_smem(handle, kernel.contract.dynamic_smem)
    return kernel


class CooperativeLauncher:
    """Launches one kernel cooperatively with a by-value parameter struct that is edited in place."""

    def __init__(self, kernel: CompiledKernel, params: ctypes.Structure):
        drv = driver()
        c = kernel.contract
        if c.threads <= 0 or c.threads > kernel.max_threads:
            raise KernelContractError(
                f"kernel declares {c.threads} threads per block; it supports at most {kernel.max_threads}")
        fits = drv.occupancy(kernel.handle, c.threads, c.dynamic_smem)
        if c.blocks_per_sm < 1 or c.blocks_per_sm > fits:
            raise KernelContractError(
                f"grid cannot co-reside: kernel asks for {c.blocks_per_sm} blocks/SM of {c.threads} threads "
                f"({kernel.registers} regs, {kernel.static_smem + c.dynamic_smem} B smem) but only {fits} fit"
            )
        self.kernel = kernel
        self.params = params
        self.grid = drv.sm_count() * c.blocks_per_sm
        self._args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        self._attr = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
        self._attr.value[0] = 1
        self._config = LaunchConfig((self.grid, 1, 1), (c.threads, 1, 1), c.dynamic_smem, None,
                                    ctypes.pointer(self._attr), 1)
        self._stream = 0
        self._drv = drv
        self._launch = drv.launch
        self._call = (ctypes.c_void_p(ctypes.addressof(self._config)), ctypes.c_void_p(kernel.handle),
                      ctypes.c_void_p(ctypes.addressof(self._args)), None)

    def launch(self, stream: int) -> None:
        """One cooperative launch on `stream` (a CUstream handle) with the struct as it stands now."""
        if stream != self._stream:
            self._config.stream = stream
            self._stream = stream
        status = self._launch(*self._call)
        if status:
            self._drv.check(status, "cuLaunchKernelEx(cooperative)")


def current_stream(device) -> int:
    """The CUstream torch is issuing to on `device` now (hot paths bind `stream_getter` once instead)."""
    return stream_getter(device)()


def stream_getter(device):
    """A no-argument callable returning the CUstream torch is issuing to on `device` now (bound once:
    resolving the device on every call cost a few hundred ns of a step's host time)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _RAW_STREAM is not None:
        return functools.partial(_RAW_STREAM, index)   # called in C: cheaper than a lambda
    return lambda: torch.cuda.current_stream(index).cuda_stream


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
