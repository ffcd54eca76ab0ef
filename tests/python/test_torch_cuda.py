"""zoe's PyTorch front-end on a GPU (zoe.device "cuda"): the engine's CUDA buffers back torch's CUDA
tensors without a copy (__cuda_array_interface__), and training matches the CPU device and plain
torch.optim.AdamW. The GPU tests skip where torch sees no GPU; scripts/gpu-check.sh runs this file
on a GPU machine and fails when they skip there. The other tests need no GPU: the interface the
binding hands out, the buffer -> tensor function on the CPU path and the device check of the inputs."""
import numpy as np
import pytest
import torch

zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")

from zoe import _zoe  # noqa: E402
from zoe.engine import _as_tensor, _view_ptr  # noqa: E402
from zoe_torch_models import clone, config, gpt_batches, make_model, train_torch, train_zoe  # noqa: E402

STEPS = 3
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="torch sees no CUDA GPU (torch.cuda.is_available() is False): the CUDA path "
                                      "of the front-end runs on a GPU machine (scripts/gpu-check.sh)")


# ---------------------------------------------------------------------------------------------
# No GPU needed


@pytest.mark.parametrize("dtype,typestr", [("f32", "<f4"), ("f16", "<f2"), ("bf16", "<i2")])
def test_device_view_interface(dtype, typestr):
    """What the binding hands out for device memory: __cuda_array_interface__ version 3 over the
    engine's pointer, flat, contiguous, ready to read (stream None); bf16 as int16."""
    ptr = 0x7F00_0000_1000
    v = _zoe.DeviceView(ptr, 12, dtype)
    assert (v.ptr, v.numel, v.dtype) == (ptr, 12, dtype)
    assert v.__cuda_array_interface__ == {"version": 3, "shape": (12,), "typestr": typestr, "data": (ptr, False),
                                          "strides": None, "stream": None}
    assert _view_ptr(v) == ptr
    with pytest.raises(zoe.ZoeError, match="dtype 'f64' is not one of f32, bf16, f16"):
        _zoe.DeviceView(ptr, 1, "f64")


@pytest.mark.parametrize("np_dtype,dtype", [(np.float32, torch.float32), (np.float16, torch.float16),
                                            (np.int16, torch.bfloat16)])
def test_as_tensor_cpu_wraps_the_buffer(np_dtype, dtype):
    """The CPU path: a NumPy view of an engine buffer becomes a tensor over the same memory, in the
    compute dtype (bf16 from the int16 bits), and writes through it reach the buffer."""
    a = np.zeros(8, dtype=np_dtype)
    t = _as_tensor(a, dtype, torch.device("cpu"))
    assert t.dtype is dtype and t.device.type == "cpu" and t.shape == (8,)
    assert t.data_ptr() == _view_ptr(a) == a.ctypes.data
    t[3] = 1.5
    want = np.array([1.5], dtype=np.float32)
    if dtype is torch.bfloat16:
        want = (want.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)  # 1.5 is exact in bf16
    assert a[3] == want.astype(np_dtype)[0] and a.sum() == a[3]


def test_cpu_engine_refuses_inputs_on_another_device(tmp_path):
    """A CPU engine (engine.device cpu) given an input elsewhere (meta stands in for a GPU here;
    a CUDA tensor too where there is one): a clear error naming the argument and both devices,
    raised before any fetch, so the engine trains on afterwards, as plain torch does."""
    model = make_model("gpt")
    ref = clone(model)
    eng = zoe.initialize(model, config=config(tmp_path, stage=0, opt="none", param="none"))
    assert eng.device == torch.device("cpu")
    data = gpt_batches(1)
    idx, tgt = data[0]
    with pytest.raises(zoe.ZoeError, match=r"argument 0 is a tensor on meta, but zoe's engine computes on cpu "
                                           r"\(zoe.device 'auto'\): move the inputs to engine.device"):
        eng(idx.to("meta"), tgt)
    with pytest.raises(zoe.ZoeError, match="argument 'idx' is a tensor on meta"):
        eng(idx=idx.to("meta"), targets=tgt)
    if torch.cuda.is_available():
        with pytest.raises(zoe.ZoeError, match="argument 0 is a tensor on cuda:0"):
            eng(idx.cuda(), tgt.cuda())
    z, _ = train_zoe(eng, data)
    t = train_torch(ref, data)
    assert abs(z[0] - t[0]) <= 1e-5 * abs(t[0])


class _Recorder:
    """Stands in for the binding's engine: forwards every call and records the names of those
    that hand buffers back, with the front-end's stream synchronizations between them."""

    def __init__(self, eng, log):
        self._eng, self._log = eng, log

    def __getattr__(self, name):
        attr = getattr(self._eng, name)
        if name not in ("release", "reduce_grads", "step"):
            return attr

        def call(*args, **kwargs):
            self._log.append(name)
            return attr(*args, **kwargs)

        return call


def test_buffers_go_back_after_a_stream_sync(tmp_path):
    """The contract of include/zoe/engine.h for device memory: torch's kernels must have finished
    with a buffer before it goes back. Every release, reduce_grads and step of a training step
    (stage 3, where release frees the gathered buffer) comes right after a synchronization (a
    no-op on the CPU device, torch.cuda's current stream on a GPU)."""
    eng = zoe.initialize(make_model("gpt"), config=config(tmp_path, stage=3, opt="cpu", param="cpu"))
    log = []
    eng._eng = _Recorder(eng._eng, log)
    sync = eng._sync
    eng._sync = lambda: (log.append("sync"), sync())
    train_zoe(eng, gpt_batches(1))
    calls = [i for i, n in enumerate(log) if n != "sync"]
    assert {log[i] for i in calls} == {"release", "reduce_grads", "step"}, log
    assert all(i > 0 and log[i - 1] == "sync" for i in calls), log


# ---------------------------------------------------------------------------------------------
# On a GPU


def _run_gpu(model, data, cfg):
    """Trains on zoe.device "cuda"; returns (losses, stats, engine). Checks on the way that CPU
    inputs are refused with a clear error (before any fetch: the engine trains on) and that a
    parameter inside its unit's forward is a CUDA tensor over the engine's own buffer."""
    eng = zoe.initialize(model, config=cfg)
    assert eng.device == torch.device("cuda", 0)  # local rank 0
    with pytest.raises(zoe.ZoeError, match=r"argument 0 is a tensor on cpu, but zoe's engine computes on cuda:0 "
                                           r"\(zoe.device 'cuda'\)"):
        eng(*data[0])
    seen = []
    block = model.h[0]
    hook = block.register_forward_pre_hook(
        lambda m, inputs: seen.append((m.fc.weight.device, m.fc.weight.data_ptr() in eng._live)))
    dev_data = [tuple(x.to(eng.device) for x in b) for b in data]
    losses, stats = train_zoe(eng, dev_data)
    hook.remove()
    assert seen and all(d == eng.device and wrapped for d, wrapped in seen), seen
    # Released: a 0-element placeholder on the GPU (moving .data to another device would drop the
    # parameter's AccumulateGrad node, and zoe's gradient hook with it).
    w = model.h[0].fc.weight
    assert w.device == eng.device and w.numel() == 0 and w.dtype == eng.compute_dtype()
    return losses, stats, eng


@needs_gpu
@pytest.mark.parametrize("stage,where", [(0, "none"), (3, "cpu"), (3, "nvme")])
def test_cuda_matches_cpu_device_and_torch(stage, where, tmp_path):
    """fp32, clipping and weight decay on, 3 steps: losses and gradient norms of the GPU engine
    within 1e-5 relative of the CPU device's, both losses within 1e-5 of torch.optim.AdamW on the
    CPU; fp32 masters within 1e-4 (GPU and CPU kernels round differently)."""
    model = make_model("gpt")
    cpu_model, ref = clone(model), clone(model)
    data = gpt_batches(STEPS)
    paths = [tmp_path / "gpu", tmp_path / "cpu"]
    for p in paths:
        p.mkdir()
    cfgs = [config(p, stage=stage, opt=where, param=where if stage == 3 else "none", device=d)
            for p, d in zip(paths, ("cuda", "cpu"))]
    zg, sg, gpu = _run_gpu(model, data, cfgs[0])
    cpu = zoe.initialize(cpu_model, config=cfgs[1])
    assert cpu.device == torch.device("cpu")
    zc, sc = train_zoe(cpu, data)
    t = train_torch(ref, data)
    for i in range(STEPS):
        assert abs(zg[i] - zc[i]) <= 1e-5 * abs(zc[i]), f"step {i + 1}: GPU loss {zg[i]}, CPU device {zc[i]}"
        assert abs(zc[i] - t[i]) <= 1e-5 * abs(t[i]), f"step {i + 1}: CPU device loss {zc[i]}, torch {t[i]}"
        assert abs(sg[i].grad_norm - sc[i].grad_norm) <= 1e-5 * sc[i].grad_norm, f"step {i + 1}"
    assert all(s.stepped and not s.skipped for s in sg)
    mg, mc = gpu.master_params(), cpu.master_params()
    want = ref.state_dict()
    for n, w in mc.items():
        assert mg[n].device.type == "cpu"
        assert (mg[n] - w).abs().max().item() <= 1e-4, n
        assert (mg[n] - want[n]).abs().max().item() <= 1e-4, n
    gpu.close()
    cpu.close()


@needs_gpu
def test_cuda_bf16_tracks_torch(tmp_path):
    """bf16 compute on the GPU (the buffers come as int16 and are viewed as bf16), stage 3 with
    CPU offload: losses within 2e-2 relative of fp32 torch and of bf16 on the CPU device."""
    model = make_model("gpt")
    cpu_model, ref = clone(model), clone(model)
    data = gpt_batches(STEPS)
    (tmp_path / "gpu").mkdir()
    (tmp_path / "cpu").mkdir()
    zg, _, gpu = _run_gpu(model, data, config(tmp_path / "gpu", stage=3, opt="cpu", param="cpu", dtype="bf16",
                                              device="cuda"))
    assert gpu.compute_dtype() is torch.bfloat16
    cpu = zoe.initialize(cpu_model, config=config(tmp_path / "cpu", stage=3, opt="cpu", param="cpu", dtype="bf16",
                                                  device="cpu"))
    zc, _ = train_zoe(cpu, data)
    t = train_torch(ref, data)
    for i in range(STEPS):
        assert abs(zg[i] - t[i]) <= 2e-2 * abs(t[i]), f"step {i + 1}: GPU bf16 loss {zg[i]}, torch fp32 {t[i]}"
        assert abs(zg[i] - zc[i]) <= 2e-2 * abs(zc[i]), f"step {i + 1}: GPU bf16 loss {zg[i]}, CPU bf16 {zc[i]}"
    gpu.close()
    cpu.close()
