"""Tests for hf_precision.diagnose.mismatch: every torch wording of a dtype/device mismatch, and explain() around a call or
of a caught error.

Messages raised on this machine are never hard-coded: the real-op tests run the op, catch what this CPU raises
(which wording depends on the CPU: oneDNN/AMX paths word a convolution mismatch differently from the slow path)
and assert that explain classifies it as the dtypes the test built. Every wording of every backend is fed as a
string in ``LITERALS``, each with the torch source that raises it.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as torch_module

import hf_precision.diagnose.mismatch as explain_mod
from hf_precision.diagnose.mismatch import MismatchError, explain, explain_error, parse_mismatch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MIXES = [(x, w) for x in DTYPES for w in DTYPES if x != w]  # (input dtype, parameter dtype)


def _check(parsed: dict | None, expected: dict | None) -> None:
    if expected is None:
        assert parsed is None
        return
    assert parsed is not None
    assert {k: parsed.get(k) for k in expected} == expected


def _raise(fn) -> BaseException:
    """What ``fn`` raises on this machine (a mixed-dtype op must refuse on every CPU)."""
    try:
        fn()
    except (RuntimeError, ValueError) as err:
        return err
    raise AssertionError("the op ran with mixed dtypes: nothing to explain")


def _r(*shape, dtype="float32"):
    return torch.randn(*shape, dtype=DTYPES[dtype])


# ---------------------------------------------------------------------------------------------------------------
# Real errors on this CPU: layers whose weights disagree with their input (expectation derived, never the wording)
# ---------------------------------------------------------------------------------------------------------------

class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2)

    def forward(self, x):
        return self.attn(x, x, x)[0]


LAYERS = {  # name: (factory, input shape)
    "linear-bias": (lambda: nn.Linear(4, 3), (2, 4)),
    "linear-nobias": (lambda: nn.Linear(4, 3, bias=False), (2, 4)),
    "linear-3d-input": (lambda: nn.Linear(4, 3), (2, 5, 4)),
    "linear-1d-input": (lambda: nn.Linear(4, 3), (4,)),
    "conv1d-bias": (lambda: nn.Conv1d(4, 4, 3), (1, 4, 8)),
    "conv2d-bias": (lambda: nn.Conv2d(4, 4, 3), (1, 4, 8, 8)),
    "conv2d-nobias": (lambda: nn.Conv2d(4, 4, 3, bias=False), (1, 4, 8, 8)),
    "conv3d-nobias": (lambda: nn.Conv3d(4, 4, (1, 3, 3), bias=False), (1, 4, 2, 8, 8)),
    "conv-transpose2d": (lambda: nn.ConvTranspose2d(4, 4, 3), (1, 4, 8, 8)),
    "prelu": (lambda: nn.PReLU(4), (2, 4)),
    "gru": (lambda: nn.GRU(4, 4), (3, 1, 4)),
    "multihead-attention": (lambda: SelfAttention(), (3, 1, 4)),
}
# CPU norms accept half input with float32 parameters, so only half parameters are a mismatch there.
NORMS = {
    "layernorm": (lambda: nn.LayerNorm(4), (2, 4)),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), (1, 4, 3, 3)),
    "batchnorm": (lambda: nn.BatchNorm1d(4).eval(), (2, 4)),
}
LAYER_CASES = [pytest.param(name, x, w, id=f"{name}-{x}-in-{w}-params") for name in LAYERS for x, w in MIXES]
LAYER_CASES += [pytest.param(name, x, w, id=f"{name}-{x}-in-{w}-params")
                for name in NORMS for x, w in MIXES if w != "float32"]


def _layer_model(name: str, w: str) -> tuple[nn.Module, tuple[int, ...]]:
    factory, shape = {**LAYERS, **NORMS}[name]
    torch.manual_seed(0)
    return nn.Sequential(factory().to(DTYPES[w])), shape


@pytest.mark.parametrize("name, x, w", LAYER_CASES)
def test_real_layer_mismatch_is_classified(name, x, w):
    model, shape = _layer_model(name, w)
    inp = _r(*shape, dtype=x)
    caught = _raise(lambda: model(inp))
    where = "0.attn" if name == "multihead-attention" else "0"  # the innermost module executing

    # whatever wording this CPU chose, the parse names these two dtypes, in the right order when it knows it
    parsed = parse_mismatch(str(caught))
    assert parsed is not None and parsed["kind"] == "dtype", str(caught)
    named = {parsed["a"], parsed["b"]} - {None}
    assert named <= {x, w}, str(caught)
    if parsed["ordered"] and parsed["a"] is not None and parsed["b"] is not None:
        assert parsed["roles"][0] in ("input", "query")
        assert (parsed["a"], parsed["b"]) == (x, w), str(caught)

    # explain() completes what the message leaves out from the module: input side first, always
    with pytest.raises(MismatchError) as info:
        with explain(model, component="unet"):
            model(inp)
    err = info.value
    assert (err.kind, err.module, err.got, err.expected, err.sides_known) == ("dtype", f"unet.{where}", x, w, True)
    assert str(err).startswith(f"dtype mismatch in unet.{where}: input is {x}, ")
    # the module computes in w and got x from its caller: the override runs it in x, never in w
    assert err.overrides == ((f"unet.dtype={x}",),)
    assert f"--set unet.dtype={w}" not in err.fix

    # the same error, caught by the caller: explain(err) reads the module from the traceback
    late = explain(caught)
    assert isinstance(late, MismatchError) and late.__cause__ is caught
    assert (late.module, late.got, late.expected) == (where, x, w)


# ops between two activations: (fn(x, w), the (a, b) dtypes of an ordered parse), x and w as in MIXES
TENSOR_OPS = {
    "bmm": (lambda x, w: torch.bmm(_r(1, 2, 4, dtype=x), _r(1, 4, 3, dtype=w)), lambda x, w: (x, w)),
    "matmul-4d": (lambda x, w: _r(1, 2, 2, 4, dtype=x) @ _r(1, 2, 4, 3, dtype=w), lambda x, w: (x, w)),
    "mm": (lambda x, w: _r(2, 4, dtype=x) @ _r(4, 3, dtype=w), lambda x, w: (x, w)),
    "einsum": (lambda x, w: torch.einsum("ij,jk->ik", _r(2, 4, dtype=x), _r(4, 3, dtype=w)), lambda x, w: (x, w)),
    "baddbmm-mask": (lambda x, w: torch.baddbmm(_r(1, 2, 3, dtype=w), _r(1, 2, 4, dtype=x), _r(1, 4, 3, dtype=x)),
                     lambda x, w: (x, w)),
    "sdpa-key-value": (lambda x, w: F.scaled_dot_product_attention(_r(1, 2, 3, 4, dtype=x), _r(1, 2, 3, 4, dtype=w),
                                                                   _r(1, 2, 3, 4, dtype=w)), lambda x, w: (x, w)),
    "index-put-mask": (lambda x, w: _r(4, dtype=x).__setitem__(torch.tensor([True, False, True, False]),
                                                               _r(2, dtype=w)), lambda x, w: (w, x)),
    "index-put-index": (lambda x, w: _r(4, dtype=x).__setitem__(torch.tensor([0, 2]), _r(2, dtype=w)),
                        lambda x, w: (w, x)),
    "index-copy": (lambda x, w: _r(4, dtype=x).index_copy_(0, torch.tensor([0]), _r(1, dtype=w)), lambda x, w: (w, x)),
    "masked-scatter": (lambda x, w: _r(4, dtype=x).masked_scatter_(torch.tensor([True, False, True, False]),
                                                                   _r(4, dtype=w)), lambda x, w: (w, x)),
    "lerp": (lambda x, w: torch.lerp(_r(4, dtype=x), _r(4, dtype=w), 0.5), lambda x, w: (w, x)),
    "dot": (lambda x, w: torch.dot(_r(4, dtype=x), _r(4, dtype=w)), lambda x, w: (x, w)),
    "grid-sample": (lambda x, w: F.grid_sample(_r(1, 1, 4, 4, dtype=x), _r(1, 2, 2, 2, dtype=w), align_corners=False),
                    lambda x, w: (x, w)),
    "binary-cross-entropy": (lambda x, w: F.binary_cross_entropy(torch.rand(4, dtype=DTYPES[x]),
                                                                 torch.rand(4, dtype=DTYPES[w])), lambda x, w: (x, w)),
}


@pytest.mark.parametrize("op, x, w", [pytest.param(op, x, w, id=f"{op}-{x}-{w}") for op in TENSOR_OPS
                                      for x, w in MIXES])
def test_real_tensor_op_mismatch_is_classified(op, x, w):
    fn, order = TENSOR_OPS[op]
    caught = _raise(lambda: fn(x, w))
    parsed = parse_mismatch(str(caught))
    assert parsed is not None and parsed["kind"] == "dtype", str(caught)
    assert {parsed["a"], parsed["b"]} == {x, w}, str(caught)
    if parsed["ordered"]:
        assert (parsed["a"], parsed["b"]) == order(x, w), str(caught)
    err = explain(caught)
    assert err.kind == "dtype" and {err.got, err.expected} == {x, w} and err.module is None


@pytest.mark.parametrize("x", ["float32", "float16", "bfloat16"])
def test_real_attention_mask_mismatch(x):
    # a float mask of another dtype than the query; a float32 mask is accepted with half queries
    masks = [m for m in ("float16", "bfloat16") if m != x]
    for m in masks:
        q = _r(1, 2, 3, 4, dtype=x)
        caught = _raise(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=_r(1, 1, 3, 3, dtype=m)))
        parsed = parse_mismatch(str(caught))
        assert parsed is not None and {parsed["a"], parsed["b"]} == {x, m}, str(caught)
        if parsed["ordered"]:
            assert (parsed["a"], parsed["b"]) == (x, m)


def test_real_device_mismatches():
    meta = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    caught = _raise(lambda: meta(torch.randn(2, 4)))
    assert parse_mismatch(str(caught))["kind"] == "device"
    err = explain(caught)
    assert (err.kind, err.module, err.got, err.expected) == ("device", "1", "cpu", "meta")
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 2, 3, 4, device="meta")
    caught = _raise(lambda: F.scaled_dot_product_attention(q, k, k))
    parsed = parse_mismatch(str(caught))
    assert parsed["kind"] == "device" and {parsed["a"], parsed["b"]} == {"cpu", "meta"}


# ---------------------------------------------------------------------------------------------------------------
# parse_mismatch: every wording, as text (the torch source of each on its line; pytorch/pytorch paths)
# ---------------------------------------------------------------------------------------------------------------

MKLDNN = " should be the same or input should be a MKLDNN tensor and weight is a dense tensor"
SAME = "Expected all tensors to be on the same device, but "
F32_F16 = {"kind": "dtype", "a": "float32", "b": "float16", "ordered": True}
LITERALS = [
    # --- aten/src/ATen/native/Convolution.cpp check_input_same_type_as_parameters and the CPU slow convolution
    ("Input type (float) and bias type (c10::Half) should be the same",
     {**F32_F16, "roles": ("input", "bias"), "family": "input_type"}),
    ("Input type (float) and bias type (c10::BFloat16) should be the same", {"kind": "dtype", "b": "bfloat16"}),
    ("Input type (c10::Half) and bias type (float) should be the same", {"a": "float16", "b": "float32"}),
    # the same on Windows (MSVC prints the type's struct name)
    ("Input type (struct c10::Half) and bias type (float) should be the same", {"a": "float16", "b": "float32"}),
    ("Input type (torch.FloatTensor) and weight type (torch.HalfTensor)" + MKLDNN,
     {**F32_F16, "roles": ("input", "weight")}),
    # measured here: a bf16 input into a float32 conv without bias takes the oneDNN path on AVX512-BF16 CPUs
    ("Input type (CPUBFloat16Type) and weight type (torch.FloatTensor)" + MKLDNN,
     {"kind": "dtype", "a": "bfloat16", "b": "float32"}),
    ("Input type (CPUHalfType) and weight type (torch.FloatTensor)" + MKLDNN, {"a": "float16", "b": "float32"}),
    ("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": True}),
    ("Input type (CUDABFloat16Type) and weight type (torch.cuda.HalfTensor) should be the same",
     {"kind": "dtype", "a": "bfloat16", "b": "float16"}),
    ("Input type (MPSFloatType) and weight type (MPSHalfType) should be the same", {"kind": "dtype", "a": "float32"}),
    # device mismatches inside an "Input type" message: CUDA (issue 11 item 5) and libtorch's C++ spelling
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor)" + MKLDNN,
     {"kind": "device", "a": "cpu", "b": "cuda", "ordered": True, "dtypes": ("float32", "float16")}),
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     {"kind": "device", "a": "cpu", "b": "cuda", "ordered": True, "dtypes": None}),
    ("Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same",
     {"kind": "device", "a": "cuda", "b": "cpu"}),
    ("Input type (CPUFloatType) and weight type (CUDAFloatType)" + MKLDNN, {"kind": "device", "a": "cpu", "b": "cuda"}),
    ("Input type (CUDABFloat16Type) and weight type (CPUBFloat16Type) should be the same",
     {"kind": "device", "a": "cuda", "b": "cpu"}),
    ("Input type (CUDABFloat16Type) and weight type (torch.FloatTensor) should be the same",
     {"kind": "device", "a": "cuda", "b": "cpu", "dtypes": ("bfloat16", "float32")}),
    ("Input type (torch.xpu.HalfTensor) and weight type (torch.xpu.FloatTensor) should be the same",
     {"kind": "dtype", "a": "float16", "b": "float32"}),
    # --- aten/src/ATen/TensorUtils.cpp checkSameType / checkScalarType / checkSameGPU / checkBackend (cuDNN paths)
    ("Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 'weight'; but type "
     "torch.cuda.HalfTensor does not equal torch.cuda.FloatTensor (while checking arguments for cudnn_convolution)",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": True, "op": "cudnn_convolution",
      "family": "tensor_arg_type"}),
    ("Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 'weight'; but type "
     "torch.FloatTensor does not equal torch.cuda.FloatTensor (while checking arguments for cudnn_batch_norm)",
     {"kind": "device", "a": "cpu", "b": "cuda"}),
    ("Expected tensor for argument #2 'weight' to have scalar type Float; but got torch.cuda.HalfTensor instead "
     "(while checking arguments for cudnn_batch_norm)",
     {**F32_F16, "argument": "weight", "family": "tensor_arg_scalar_type"}),
    ("Expected tensor for argument #1 'input' to have the same device as tensor for argument #2 'weight'; but device "
     "0 does not equal 1 (while checking arguments for cudnn_convolution)",
     {"kind": "device", "a": "cuda:0", "b": "cuda:1", "ordered": True, "family": "tensor_arg_device"}),
    ("Tensor for argument #1 'input' is on CPU, but expected it to be on GPU (while checking arguments for "
     "cudnn_convolution)", {"kind": "device", "a": "cpu", "b": "cuda", "ordered": True, "family": "tensor_arg_on_cpu"}),
    ("Expected tensor to have CUDA Backend, but got tensor with CPU Backend (while checking arguments for "
     "cudnn_convolution)", {"kind": "device", "a": "cpu", "b": "cuda", "ordered": False, "family": "backend"}),
    ("Expected tensor to have cuda DeviceType, but got tensor with cpu DeviceType (while checking arguments for "
     "addmm)", {"kind": "device", "a": "cpu", "b": "cuda"}),
    # --- aten/src/ATen/native/LinearAlgebra.cpp (addmm meta, CPU addmm_impl_cpu_, addmv, baddbmm meta, dot)
    ("mat1 and mat2 must have the same dtype, but got Float and Half", {**F32_F16, "family": "mat1_mat2"}),
    ("mat1 and mat2 must have the same dtype, but got BFloat16 and Float", {"a": "bfloat16", "b": "float32"}),
    ("self and mat2 must have the same dtype, but got Half and Float",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": False, "family": "self_mat2"}),
    ("expected m1 and m2 to have the same dtype, but got: float != c10::Half", {**F32_F16, "family": "m1_m2"}),
    ("expected m1 and m2 to have the same dtype, but got: c10::Half != float", {"a": "float16", "b": "float32"}),
    # aten/src/ATen/native/cuda/Blas.cpp addmm_out_cuda_impl (F.linear without bias on CUDA)
    ("expected mat1 and mat2 to have the same dtype, but got: float != c10::Half", {**F32_F16, "family": "m1_m2"}),
    ("expected mat1 and mat2 to have the same dtype, but got: c10::BFloat16 != float",
     {"a": "bfloat16", "b": "float32"}),
    ("addmv input tensors must have the same dtype, but got Half, Half, and Float",
     {"kind": "dtype", "a": "float32", "b": "float16", "roles": ("input", "weight"), "family": "addmv"}),
    ("Input dtypes must be the same, got: input c10::Half, batch1: float, batch2: float",
     {"kind": "dtype", "a": "float32", "b": "float16", "family": "baddbmm"}),
    # torch/_meta_registrations.py meta_baddbmm (meta and fake tensors, torch.compile)
    ("Input dtypes must be the same, got: input: torch.float16, batch1: torch.float32, batch2: torch.float32",
     {"a": "float32", "b": "float16", "family": "baddbmm"}),
    ("dot : expected both vectors to have same dtype, but found Float and Half",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": False, "family": "dot"}),
    # aten/src/ATen/native/Activation.cpp prelu
    ("prelu: Type promoting not supported. Got Half and Float", {"a": "float16", "b": "float32", "family": "prelu"}),
    # --- c10 TensorBase::data_ptr<T> (CPU bmm/conv without bias/grid_sample; CUDA norms) and the meta registrations
    ("expected scalar type Float but found Half",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": False, "family": "scalar_type"}),
    ("expected scalar type Half but found Float", {"a": "float16", "b": "float32", "ordered": False}),
    ("expected scalar type BFloat16 but found Float", {"kind": "dtype", "a": "bfloat16", "b": "float32"}),
    ("expected scalar type Double but found Float", {"a": "float64", "b": "float32"}),
    ("expected scalar type torch.float32 but found torch.float16", {"a": "float32", "b": "float16"}),
    # aten/src/ATen/TensorIterator.cpp compute_types (binary_cross_entropy with another target dtype)
    ("Found dtype Half but expected Float",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": False, "family": "found_dtype"}),
    # torch.polar (measured here) and torch 1.x TH bindings
    ("Expected object of scalar type Float but got scalar type Half for second argument",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": False, "family": "object_scalar_type"}),
    ("Expected object of scalar type Float but got scalar type Half for argument #2 'mat2' in call to _th_mm",
     {**F32_F16, "argument": "mat2"}),
    # --- aten/src/ATen/native/mixed_dtypes.h check_mixed_data_type (CPU layer_norm/group_norm/batch_norm)
    ("mixed dtype (CPU): expect parameter to have scalar type of Float",
     {"kind": "dtype", "a": None, "b": None, "norm": True, "family": "mixed_dtype_cpu"}),
    ("mixed dtype (CPU): all inputs must share same datatype.", {"kind": "dtype", "a": None, "norm": True}),
    # --- aten/src/ATen/native/transformers/sdp_utils_cpp.h; torch/nn/attention/_utils.py (ValueError, commas)
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: c10::Half "
     "and value.dtype: c10::Half instead.",
     {"kind": "dtype", "a": "float32", "b": "float16", "roles": ("query", "key and value"), "family": "sdpa"}),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: float "
     "and value.dtype: c10::BFloat16 instead.", {"a": "float32", "b": "bfloat16", "roles": ("query", "value")}),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: torch.float16, key.dtype: "
     "torch.float32, and value.dtype: torch.float32 instead.", {"a": "float16", "b": "float32", "family": "sdpa"}),
    ("Expected attn_mask dtype to be bool or float or to match query dtype, but got attn_mask.dtype: c10::Half and  "
     "query.dtype: float instead.",
     {"kind": "dtype", "a": "float32", "b": "float16", "roles": ("query", "attention mask"), "family": "sdpa_mask"}),
    # --- aten/src/ATen/native/TensorAdvancedIndexing.cpp (x[mask] = y, index_copy_, put_, masked_scatter_, scatter)
    ("Index put requires the source and destination dtypes match, got Float for the destination and Half for the "
     "source.", {"kind": "dtype", "a": "float16", "b": "float32", "roles": ("source", "destination"),
                 "family": "index_put"}),
    ("index_copy_(): self and source expected to have the same dtype, but got (self) Float and (source) Half",
     {"a": "float16", "b": "float32", "family": "index_copy"}),
    ("put_(): self and source expected to have the same dtype, but got self.dtype = Half and source.dtype = Float",
     {"a": "float32", "b": "float16", "family": "index_copy"}),
    ("masked_scatter: expected self and source to have same dtypes but gotFloat and Half",
     {"a": "float16", "b": "float32", "family": "masked_scatter"}),
    ("scatter(): Expected self.dtype to be equal to src.dtype", {"kind": "dtype", "a": None, "family": "scatter"}),
    # --- aten/src/ATen/native/Lerp.cpp; out= checks in aten/src/ATen/native/LinearAlgebra.cpp
    ("expected dtype float for `end` but got dtype c10::Half",
     {"a": "float16", "b": "float32", "roles": ("`end`", "self"), "family": "lerp"}),
    ("Expected out tensor to have dtype float, but got c10::Half instead", {"a": "float16", "family": "out_dtype"}),
    # --- torch/nn/modules/rnn.py RNNBase.check_input (ValueError); aten/src/ATen/native/RNN.cpp check_attributes
    ("RNN input dtype (torch.float32) does not match weight dtype (torch.float16). Convert input: "
     "input.to(torch.float16), or convert model: model.to(torch.float32)", {**F32_F16, "family": "rnn_dtype"}),
    ("Input and parameter tensors are not the same dtype, found input tensor with Half and parameter tensor with "
     "Float", {"a": "float16", "b": "float32", "family": "rnn_dtype"}),
    # --- devices: aten/src/ATen/core/op_registration/adaption.h common_device_check_failure
    (SAME + "found at least two devices, cpu and cuda:0! (when checking argument for argument index in method "
     "wrapper__index_select)",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "argument": "index",
      "op": "wrapper__index_select", "family": "devices_found"}),
    (SAME + "found at least two devices, cpu and cuda:0! (when checking argument for argument mat1 in method "
     "wrapper_CUDA_addmm)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "argument": "mat1"}),
    (SAME + "got index is on cuda:0, different from other tensors on cpu (when checking argument in method "
     "wrapper_CUDA__index_select)",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "family": "device_got"}),
    (SAME + "got mat1 is on cpu, different from other tensors on cuda:0 (when checking argument in method "
     "wrapper_CUDA_addmm)", {"kind": "device", "a": "cpu", "b": "cuda:0", "ordered": True}),
    (SAME + "got mat2 is on cpu, different from other tensors on cuda:0 (when checking argument in method "
     "wrapper_CUDA_mm)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True}),
    (SAME + "got weight is on cpu, different from other tensors on cuda:1 (when checking argument in method "
     "wrapper_CUDA__native_layer_norm)", {"kind": "device", "a": "cuda:1", "b": "cpu", "ordered": True}),
    (SAME + "got mat1 is on cpu, different from other tensors on cuda:0", {"kind": "device", "a": "cpu"}),
    # device messages without a named argument, and with the ambiguous "self": message order, unordered
    (SAME + "found at least two devices, cuda:0 and cpu!",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": False}),
    (SAME + "found at least two devices, cuda:0 and cpu! (when checking argument for argument self in method "
     "wrapper_CUDA__add)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": False, "argument": "self"}),
    # aten/src/ATen/native/LinearAlgebra.cpp addmm_impl_cpu_: a CUDA tensor in a CPU matmul
    (SAME[:-6] + ". addmm: expected 'mat1' to be a CPU tensor, but got tensor on cuda:0",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "family": "device_cpu_op"}),
    (SAME[:-6] + ". addmm expected 't' to be CPU tensor, but got tensor on cuda:0",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": False, "family": "device_cpu_op"}),
    # aten/src/ATen/TensorIterator.cpp (measured here: a meta weight never loaded)
    ("Tensor on device meta is not on the expected device cpu!",
     {"kind": "device", "a": "meta", "b": "cpu", "ordered": False, "family": "expected_device"}),
    ("Expected query, key, and value to have the same device type, but got query.device: cpu key.device: cuda:0 "
     "and value.device: cuda:0 instead.",
     {"kind": "device", "a": "cpu", "b": "cuda:0", "roles": ("query", "key and value"), "family": "sdpa_device"}),
    ("Input and parameter tensors are not at the same device, found input tensor at cpu and parameter tensor at "
     "cuda:0", {"kind": "device", "a": "cpu", "b": "cuda:0", "ordered": True, "family": "rnn_device"}),
    # aten/src/ATen/native/mps/OperationUtils.mm and mps/operations/Linear.mm
    ("Placeholder storage has not been allocated on MPS device!",
     {"kind": "device", "a": "cpu", "b": "mps", "ordered": False, "family": "mps_placeholder"}),
    ("Tensor for argument input is on cpu but expected on mps",
     {"kind": "device", "a": "cpu", "b": "mps", "ordered": True, "family": "mps_argument"}),
    ("Tensor for argument weight is on cpu but expected on mps", {"kind": "device", "a": "mps", "b": "cpu"}),
    ("index_put_: expected device cuda:0 but got device cpu for value tensor",
     {"kind": "device", "a": "cpu", "b": "cuda:0", "family": "index_put_device"}),
    # torch 1.x TH bindings
    ("Expected object of device type cuda but got device type cpu for argument #1 'self' in call to _th_addmm",
     {"kind": "device", "a": "cpu", "b": "cuda", "ordered": False, "family": "object_device_type"}),
    # embedded in a longer text (a wrapper re-raising with context, torch.compile)
    ("Error in node X: mat1 and mat2 must have the same dtype, but got Half and Float (see log)",
     {"a": "float16", "b": "float32"}),
    ("RuntimeError: expected scalar type 'Float' but found 'Half'.", {"a": "float32", "b": "float16"}),
    ("mat1 and mat2 must have the same dtype, but got Float and Half. Cast your inputs.",
     {"a": "float32", "b": "float16"}),
    ("Failed running call_function <built-in function linear>(*(FakeTensor(..., size=(2, 4)), Parameter(FakeTensor("
     "..., size=(3, 4), dtype=torch.float16))), **{}): expected m1 and m2 to have the same dtype, but got: float != "
     "c10::Half", F32_F16),
    # not precision mismatches
    ("CUDA out of memory. Tried to allocate 2.00 MiB", None),
    ("expected scalar type Long but found Float", None),
    ("Found dtype Long but expected Float", None),
    ("Index put requires the source and destination dtypes match, got Long for the destination and Int for the "
     "source.", None),
    ("Input type (torch.FloatTensor) and weight type (torch.FloatTensor) should be the same", None),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: float and "
     "value.dtype: float instead.", None),
    ("", None),
]


@pytest.mark.parametrize("message, expected", LITERALS, ids=[f"{i:02d}" for i in range(len(LITERALS))])
def test_parse_literal_messages(message, expected):
    _check(parse_mismatch(message), expected)


def test_every_family_is_covered():
    families = {parse_mismatch(m)["family"] for m, e in LITERALS if e is not None}
    assert families == {f.name for f in explain_mod._FAMILIES}


@pytest.mark.parametrize("message, expected", [(m, e) for m, e in LITERALS if e is not None],
                         ids=[f"{i:02d}" for i, (m, e) in enumerate(LITERALS) if e is not None])
def test_every_literal_is_explained(message, expected):
    err = explain_error(RuntimeError(message))
    assert isinstance(err, MismatchError) and err.kind == expected.get("kind", err.kind)
    header, fix, quoted = str(err).split("\n")
    assert header.startswith(("dtype mismatch", "device mismatch", "device and dtype mismatch"))
    assert fix.startswith("fix: ")
    assert quoted == f"torch: {message!r}"
    if err.dtypes:  # a device mismatch that is also a dtype one says both
        assert header.startswith("device and dtype mismatch") and all(d in header for d in err.dtypes)
        assert f"torch.{err.dtypes[1]}" in err.fix


def test_value_errors_only_for_torchs_own_value_error_wordings():
    rnn = ValueError("RNN input dtype (torch.float32) does not match weight dtype (torch.float16). Convert input: "
                     "input.to(torch.float16), or convert model: model.to(torch.float32)")
    assert explain(rnn).family == "rnn_dtype"
    assert explain(ValueError("mat1 and mat2 must have the same dtype, but got Float and Half")) is None


# ---------------------------------------------------------------------------------------------------------------
# explain(): bare modules
# ---------------------------------------------------------------------------------------------------------------


def test_explain_bare_module_linear():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).to(torch.float16)
    with pytest.raises(MismatchError) as info:
        with explain(model):
            model(torch.randn(2, 4))
    err = info.value
    assert (err.kind, err.module, err.component, err.got, err.expected) == ("dtype", "0", None, "float32", "float16")
    assert err.sides_known and err.family == "mat1_mat2"
    assert str(err).splitlines()[0] == "dtype mismatch in 0: input is float32, weights are float16"
    # the model already computes in float16: the fix runs it in its input's dtype, never "make it float16"
    assert "--set <component>.dtype=float32" in err.fix and "apply_recipe" in err.fix
    assert "dtype=float16" not in err.fix and err.overrides == ()  # no component name: nothing to apply as is
    assert isinstance(err.__cause__, RuntimeError) and not isinstance(err.__cause__, MismatchError)
    assert err.original is err.__cause__
    assert str(err).endswith(repr(str(err.original)))  # torch's message, quoted, last


def test_explain_bare_module_with_component_name():
    model = nn.Sequential(nn.Linear(4, 4, bias=False)).to(torch.bfloat16)
    with pytest.raises(MismatchError) as info:
        with explain(model, component="text_encoder"):
            model(torch.randn(2, 4))
    err = info.value
    assert (err.module, err.component, err.got, err.expected) == ("text_encoder.0", "text_encoder", "float32",
                                                                   "bfloat16")
    assert "`--set text_encoder.dtype=float32`" in err.fix
    assert "components: {text_encoder: {dtype: float32}}" in err.fix
    assert "dtype=bfloat16" not in err.fix and err.overrides == (("text_encoder.dtype=float32",),)


def test_scalar_type_sides_come_from_the_module():
    # "expected scalar type Float but found Half" does not say which is the input: the conv's weights do.
    model = nn.Sequential(nn.Conv2d(4, 4, 3, bias=False)).to(torch.float16)
    with pytest.raises(MismatchError) as info:
        with explain(model):
            model(torch.randn(1, 4, 8, 8))
    err = info.value
    assert (err.module, err.got, err.expected, err.sides_known) == ("0", "float32", "float16", True)
    assert err.family == "scalar_type"


def test_norm_with_half_parameters_in_float32_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    model[1].to(torch.float16)
    with pytest.raises(MismatchError) as info:
        with explain(model, component="text_encoder"):
            model(torch.randn(2, 4))
    err = info.value
    assert (err.module, err.got, err.expected) == ("text_encoder.1", "float32", "float16")
    assert str(err).startswith("dtype mismatch in text_encoder.1: input is float32, parameters are float16")
    assert "norm" in err.fix and "`--set text_encoder.keep_fp32=[1]`" in err.fix


def test_meta_device_mismatch():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    with pytest.raises(MismatchError) as info:
        with explain(model, component="text_encoder"):
            model(torch.randn(2, 4))
    err = info.value
    assert (err.kind, err.module, err.got, err.expected) == ("device", "text_encoder.1", "cpu", "meta")
    assert "never loaded" in err.fix


def test_device_fix_text():
    msg = (SAME + "found at least two devices, cuda:0 and cpu! (when checking argument for argument mat1 in "
           "method wrapper_CUDA_addmm)")
    err = explain_error(RuntimeError(msg), "text_encoder.text_model.embeddings.token_embedding")
    assert str(err).splitlines()[0] == ("device mismatch in text_encoder.text_model.embeddings.token_embedding: "
                                        "input is on cpu, weights are on cuda:0")
    assert 'device={"text_encoder": "cuda:0"}' in err.fix and 'pipe.to("cuda:0")' in err.fix


# ---------------------------------------------------------------------------------------------------------------
# explain(): a real tiny diffusers UNet in a pipeline-like object
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unet():
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, cross_attention_dim=8,
        attention_head_dim=2, sample_size=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))


def _unet_inputs(dtype):
    return torch.randn(1, 4, 8, 8, dtype=dtype), torch.tensor([10]), torch.randn(1, 3, 8, dtype=dtype)


def test_explain_tiny_unet_pipeline(unet):
    unet = unet.to(torch.float16)
    pipe = SimpleNamespace(components={"unet": unet, "scheduler": object(), "tokenizer": None})
    sample, t, ehs = _unet_inputs(torch.float32)
    with pytest.raises(MismatchError) as info:
        with explain(pipe):
            unet(sample, t, encoder_hidden_states=ehs)
    err = info.value
    assert err.module == "unet.time_embedding.linear_1"
    assert (err.component, err.got, err.expected, err.kind) == ("unet", "float32", "float16", "dtype")
    assert str(err).splitlines()[0] == ("dtype mismatch in unet.time_embedding.linear_1: input is float32, "
                                        "weights are float16")
    # unet is float16 already and no other component made the float32 input: never "--set unet.dtype=float16"
    assert "unet.dtype=float16" not in err.fix
    assert "`--set unet.dtype=float32` (YAML: components: {unet: {dtype: float32}})" in err.fix
    assert err.overrides == (("unet.dtype=float32",),)
    assert "load_pipeline" in err.fix and "apply_recipe" in err.fix and "passed to the pipeline" in err.fix
    assert str(err).endswith("'mat1 and mat2 must have the same dtype, but got Float and Half'")
    assert isinstance(err.__cause__, RuntimeError)


def test_explain_float32_island(unet):
    unet = unet.to(torch.float16)
    unet.time_embedding.to(torch.float32)  # S15: an fp32 island the forward code does not cast into
    pipe = SimpleNamespace(components={"unet": unet})
    sample, t, ehs = _unet_inputs(torch.float16)
    with pytest.raises(MismatchError) as info:
        with explain(pipe):
            unet(sample, t, encoder_hidden_states=ehs)
    err = info.value
    assert (err.module, err.got, err.expected) == ("unet.time_embedding.linear_1", "float16", "float32")
    assert "float32 island unet.time_embedding" in err.fix
    assert "`--set unet.keep_fp32=[time_embedding]`" in err.fix and "apply_recipe" in err.fix


def test_explain_without_target_names_inside_outermost_module(unet):
    unet = unet.to(torch.bfloat16)
    sample, t, ehs = _unet_inputs(torch.float32)

    @explain()
    def run():
        return unet(sample, t, encoder_hidden_states=ehs)

    with pytest.raises(MismatchError) as info:
        run()
    assert (info.value.module, info.value.component) == ("time_embedding.linear_1", None)
    assert info.value.expected == "bfloat16"


def test_explain_error_with_target_resolves_island(unet):
    unet = unet.to(torch.float16)
    unet.time_embedding.to(torch.float32)
    pipe = SimpleNamespace(components={"unet": unet})
    exc = RuntimeError("mat1 and mat2 must have the same dtype, but got Half and Float")
    err = explain_error(exc, "unet.time_embedding.linear_1", target=pipe)
    assert err.__cause__ is exc and "keep_fp32=[time_embedding]" in err.fix
    unet.to(torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# Pass-through, hooks, decorator, nesting
# ---------------------------------------------------------------------------------------------------------------


class Raiser(nn.Module):
    def __init__(self, exc):
        super().__init__()
        self.exc = exc
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        self.lin(x)
        raise self.exc


@pytest.mark.parametrize("exc", [RuntimeError("something else entirely"), ValueError("bad value"),
                                 KeyError("k"), RuntimeError("expected scalar type Long but found Float")],
                         ids=["runtime", "value", "key", "int-float"])
def test_other_exceptions_pass_through_unchanged(exc):
    model = nn.Sequential(Raiser(exc))
    with pytest.raises(type(exc)) as info:
        with explain(model):
            model(torch.randn(1, 2))
    assert info.value is exc
    assert not isinstance(info.value, MismatchError)


def test_mismatch_outside_any_module_is_still_explained():
    with pytest.raises(MismatchError) as info:
        with explain():
            torch.randn(2, 2) @ torch.randn(2, 2, dtype=torch.float16)
    err = info.value
    assert err.module is None and err.component is None
    assert str(err).startswith("dtype mismatch: input is float32, weights are float16")


def _hook_counts():
    return (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks),
            len(torch_module._global_forward_hooks_always_called))


def test_global_hooks_removed_after_exit():
    baseline = _hook_counts()
    model = nn.Sequential(nn.Linear(2, 2))
    with explain(model):
        assert _hook_counts() != baseline
        model(torch.randn(1, 2))
    assert _hook_counts() == baseline
    model.half()
    with pytest.raises(MismatchError):
        with explain(model):
            model(torch.randn(1, 2))
    assert _hook_counts() == baseline
    with pytest.raises(ZeroDivisionError):
        with explain(model):
            1 / 0
    assert _hook_counts() == baseline


def test_decorator_forms():
    model = nn.Sequential(nn.Linear(2, 2)).to(torch.float16)

    @explain(model, component="unet")
    def bad(x):
        return model(x)

    @explain
    def bare(x):
        return model(x)

    @explain()
    def good(x):
        return model(x.half())

    assert bad.__name__ == "bad"
    baseline = _hook_counts()
    with pytest.raises(MismatchError) as info:
        bad(torch.randn(1, 2))
    assert info.value.module == "unet.0"
    with pytest.raises(MismatchError) as info:
        bare(torch.randn(1, 2))
    assert info.value.module == "0"
    assert good(torch.randn(1, 2)).dtype == torch.float16
    assert _hook_counts() == baseline


def test_caught_inner_error_does_not_misplace_a_later_one():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.child = nn.Linear(2, 2).to(torch.float16)
            self.weight = nn.Parameter(torch.ones(2, 2, dtype=torch.float16))

        def forward(self, x):
            try:
                self.child(x)  # fails, and is swallowed on purpose
            except RuntimeError:
                pass
            return x @ self.weight  # fails in Parent itself, not in a submodule

    model = nn.Sequential(Parent())
    with pytest.raises(MismatchError) as info:
        with explain(model):
            model(torch.randn(1, 2))
    assert info.value.module == "0"
    assert info.value.family == "m1_m2"


def test_wrapped_mismatch_is_located_where_torch_raised():
    class Wrapper(nn.Module):  # library code that re-raises with its own context
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(2, 2)).to(torch.float16)

        def forward(self, x):
            try:
                return self.inner(x)
            except RuntimeError as e:
                raise RuntimeError(f"wrapper failed: {e}") from e

    model = Wrapper()
    with pytest.raises(MismatchError) as info:
        with explain(model, component="unet"):
            model(torch.randn(1, 2))
    assert info.value.module == "unet.inner.0"
    assert str(info.value.__cause__).startswith("wrapper failed: ")


def test_nested_explain_raises_once():
    model = nn.Sequential(nn.Linear(2, 2)).to(torch.float16)
    with pytest.raises(MismatchError) as info:
        with explain(model, component="outer"):
            with explain(model, component="inner"):
                model(torch.randn(1, 2))
    assert info.value.module == "inner.0"
    assert not isinstance(info.value.__cause__, MismatchError)


def test_context_is_not_reentrant_but_reusable():
    ctx = explain()
    with ctx:
        with pytest.raises(RuntimeError, match="already active"):
            ctx.__enter__()
    with ctx:
        pass


def test_bad_target():
    with pytest.raises(TypeError, match="components") as info:
        explain("unet")
    assert "caught exception" in str(info.value) and "not str" in str(info.value)


def test_explain_of_a_caught_error():
    model = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)).to(torch.bfloat16)
    try:
        model(torch.randn(1, 2))
    except RuntimeError as caught:
        err = explain(caught)
        assert err.__cause__ is caught and err.original is caught
    assert (err.module, err.component, err.got, err.expected, err.sides_known) == ("0", None, "float32", "bfloat16",
                                                                                    True)
    assert explain(err) is err  # already explained
    assert explain(KeyError("k")) is None and explain(RuntimeError("boom")) is None


def test_explain_of_a_caught_wrapped_error_finds_where_torch_raised():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(2, 2)).to(torch.float16)

        def forward(self, x):
            try:
                return self.inner(x)
            except RuntimeError as e:
                raise RuntimeError(f"wrapper failed: {e}") from e

    try:
        Wrapper()(torch.randn(1, 2))
    except RuntimeError as caught:
        err = explain(caught)
    assert (err.module, err.got, err.expected) == ("inner.0", "float32", "float16")
    assert str(err.__cause__).startswith("wrapper failed: ")


def test_explain_of_a_caught_norm_error_reads_the_input_from_the_traceback():
    # "mixed dtype (CPU)" names neither dtype: the norm's input comes from its frame, its parameters from it
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    model[1].to(torch.float16)
    try:
        model(torch.randn(2, 4))
    except RuntimeError as caught:
        err = explain(caught)
    assert (err.module, err.got, err.expected) == ("1", "float32", "float16")


def test_explain_error_pass_through():
    assert explain_error(ValueError("mat1 and mat2 must have the same dtype, but got Float and Half")) is None
    assert explain_error(RuntimeError("boom")) is None
    err = explain_error(RuntimeError("expected scalar type Float but found Half"), "vae.decoder.conv_in")
    assert err.component == "vae" and not err.sides_known
    assert explain_error(err) is err


def test_mismatch_error_pickles():
    import pickle

    err = explain_error(RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Half"), "unet.x")
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.module, copy.got, copy.expected) == (str(err), "unet.x", "float32", "float16")
    assert (copy.overrides, copy.dtypes) == (err.overrides, err.dtypes)


def test_no_torch_import_at_import_time():
    code = "import sys, hf_precision.diagnose.mismatch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
