"""Tests for hf_precision.mismatch: message parsing (every §2.1 family, CPU and CUDA wordings) and the context."""

from __future__ import annotations

import doctest
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as torch_module

import hf_precision.mismatch as explain_mod
from hf_precision.mismatch import MismatchError, explain, explain_error, parse_mismatch

HALF = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def _message(fn) -> str:
    with pytest.raises(RuntimeError) as info:
        fn()
    return str(info.value)


def _check(parsed: dict | None, expected: dict | None) -> None:
    if expected is None:
        assert parsed is None
        return
    assert parsed is not None
    assert {k: parsed.get(k) for k in expected} == expected


# ---------------------------------------------------------------------------------------------------------------
# parse_mismatch: real CPU messages, produced by running mismatched ops (torch 2.13 CPU)
# ---------------------------------------------------------------------------------------------------------------


def _linear(x, w, bias):
    return nn.Linear(4, 4, bias=bias).to(w)(torch.randn(2, 4, dtype=x))


def _conv(x, w, bias):
    return nn.Conv2d(4, 4, 3, bias=bias).to(w)(torch.randn(1, 4, 8, 8, dtype=x))


def _sdpa(q, kv):
    t = lambda d: torch.randn(1, 2, 3, 4, dtype=d)  # noqa: E731
    return F.scaled_dot_product_attention(t(q), t(kv), t(kv))


# (op, input dtype, parameter dtype) -> expected parse, for both directions of every half dtype
def _cpu_cases():
    for half in (torch.float16, torch.bfloat16):
        h = NAMES[half]
        for x, w in ((torch.float32, half), (half, torch.float32)):
            xi, wi = NAMES[x], NAMES[w]
            d = f"{xi}-in-{wi}-params"
            ordered = {"kind": "dtype", "a": xi, "b": wi, "ordered": True}
            yield pytest.param(lambda x=x, w=w: _linear(x, w, True), {**ordered, "family": "mat1_mat2"},
                               id=f"linear-bias-{d}")
            yield pytest.param(lambda x=x, w=w: _linear(x, w, False), {**ordered, "family": "m1_m2"},
                               id=f"linear-nobias-{d}")
            yield pytest.param(lambda x=x, w=w: _conv(x, w, True), {**ordered, "family": "input_type"},
                               id=f"conv2d-bias-{d}")
            # Measured: float32 input into a half conv without bias says "expected scalar type Float but found
            # Half" (no input/weight roles); the reverse says "Input type (torch.HalfTensor) and weight type ...".
            nobias = ({"kind": "dtype", "a": xi, "b": wi, "ordered": False, "family": "scalar_type"}
                      if x is torch.float32 else {**ordered, "family": "input_type"})
            yield pytest.param(lambda x=x, w=w: _conv(x, w, False), nobias, id=f"conv2d-nobias-{d}")
            yield pytest.param(lambda x=x, w=w: _sdpa(x, w),
                               {"kind": "dtype", "a": xi, "b": wi, "family": "sdpa",
                                "roles": ("query", "key and value")}, id=f"sdpa-{d}")
        norm = {"kind": "dtype", "a": "float32", "b": None, "norm": True, "family": "mixed_dtype_cpu"}
        yield pytest.param(lambda half=half: nn.LayerNorm(4).to(half)(torch.randn(2, 4)), norm,
                           id=f"layernorm-{h}-params-float32-in")
        yield pytest.param(lambda half=half: nn.GroupNorm(2, 4).to(half)(torch.randn(1, 4, 3, 3)), norm,
                           id=f"groupnorm-{h}-params-float32-in")
    yield pytest.param(lambda: nn.Linear(4, 4, device="meta")(torch.randn(2, 4)),
                       {"kind": "device", "a": "meta", "b": "cpu", "ordered": False, "family": "expected_device"},
                       id="meta-weights-cpu-input")
    yield pytest.param(lambda: nn.LayerNorm(4)(torch.randn(2, 4, dtype=torch.float64)),
                       {"kind": "dtype", "a": None, "b": None, "norm": True, "family": "mixed_dtype_cpu"},
                       id="layernorm-float32-params-float64-in")
    yield pytest.param(lambda: torch.bmm(torch.randn(1, 2, 4), torch.randn(1, 4, 4, dtype=torch.float16)),
                       {"kind": "dtype", "a": "float32", "b": "float16", "ordered": False}, id="bmm-scalar-type")


@pytest.mark.parametrize("fn, expected", list(_cpu_cases()))
def test_parse_real_cpu_messages(fn, expected):
    _check(parse_mismatch(_message(fn)), expected)


# ---------------------------------------------------------------------------------------------------------------
# parse_mismatch: literal strings (facts §2.1 CPU table and its CUDA quotes, §2.2 table, issue reports)
# ---------------------------------------------------------------------------------------------------------------

MKLDNN = " should be the same or input should be a MKLDNN tensor and weight is a dense tensor"
SAME = "Expected all tensors to be on the same device, but "
LITERALS = [
    # facts §2.1, CPU
    ("Input type (float) and bias type (c10::Half) should be the same",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": True, "roles": ("input", "bias")}),
    ("Input type (float) and bias type (c10::BFloat16) should be the same",
     {"kind": "dtype", "a": "float32", "b": "bfloat16"}),
    ("Input type (c10::Half) and bias type (float) should be the same", {"a": "float16", "b": "float32"}),
    ("Input type (torch.FloatTensor) and weight type (torch.HalfTensor)" + MKLDNN,
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": True, "roles": ("input", "weight")}),
    ("Input type (CPUBFloat16Type) and weight type (torch.FloatTensor)" + MKLDNN,
     {"kind": "dtype", "a": "bfloat16", "b": "float32"}),
    ("mat1 and mat2 must have the same dtype, but got Float and Half",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": True, "family": "mat1_mat2"}),
    ("mat1 and mat2 must have the same dtype, but got BFloat16 and Float", {"a": "bfloat16", "b": "float32"}),
    ("expected m1 and m2 to have the same dtype, but got: float != c10::Half",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": True, "family": "m1_m2"}),
    ("expected m1 and m2 to have the same dtype, but got: c10::Half != float", {"a": "float16", "b": "float32"}),
    ("mixed dtype (CPU): expect parameter to have scalar type of Float",
     {"kind": "dtype", "a": "float32", "b": None, "norm": True}),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: c10::Half "
     "and value.dtype: c10::Half instead.",
     {"kind": "dtype", "a": "float32", "b": "float16", "roles": ("query", "key and value")}),
    ("Expected query, key, and value to have the same dtype, but got query.dtype: float key.dtype: float "
     "and value.dtype: c10::BFloat16 instead.", {"a": "float32", "b": "bfloat16", "roles": ("query", "value")}),
    ("Tensor on device meta is not on the expected device cpu!",
     {"kind": "device", "a": "meta", "b": "cpu", "ordered": False, "family": "expected_device"}),
    # facts §2.1, CUDA (from issues)
    ("expected scalar type Float but found Half",
     {"kind": "dtype", "a": "float32", "b": "float16", "ordered": False, "family": "scalar_type"}),
    ("Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     {"kind": "dtype", "a": "float16", "b": "float32", "ordered": True}),
    (SAME + "found at least two devices, cpu and cuda:0! (when checking argument for argument index in method "
     "wrapper__index_select)",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "argument": "index",
      "op": "wrapper__index_select", "family": "devices_found"}),
    (SAME + "found at least two devices, cpu and cuda:0! (when checking argument for argument mat1 in method "
     "wrapper_CUDA_addmm)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "argument": "mat1"}),
    # the newer form quoted from libtorch_cpu.so: "got <arg> is on <dev>, different from other tensors on <dev>"
    (SAME + "got index is on cuda:0, different from other tensors on cpu (when checking argument in method "
     "wrapper_CUDA__index_select)",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "family": "device_got"}),
    (SAME + "got mat1 is on cpu, different from other tensors on cuda:0 (when checking argument in method "
     "wrapper_CUDA_addmm)", {"kind": "device", "a": "cpu", "b": "cuda:0", "ordered": True}),
    (SAME + "got mat2 is on cpu, different from other tensors on cuda:0 (when checking argument in method "
     "wrapper_CUDA_mm)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True}),
    (SAME + "got weight is on cpu, different from other tensors on cuda:1 (when checking argument in method "
     "wrapper_CUDA__native_layer_norm)", {"kind": "device", "a": "cuda:1", "b": "cpu", "ordered": True}),
    # device messages without a named argument, and with the ambiguous "self": message order, unordered
    (SAME + "found at least two devices, cuda:0 and cpu!",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": False}),
    (SAME + "found at least two devices, cuda:0 and cpu! (when checking argument for argument self in method "
     "wrapper_CUDA__add)", {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": False, "argument": "self"}),
    (SAME[:-6] + ". addmm: expected 'mat1' to be a CPU tensor, but got tensor on cuda:0",
     {"kind": "device", "a": "cuda:0", "b": "cpu", "ordered": True, "family": "device_cpu_op"}),
    # CUDA convolution wordings from issue reports: device mismatches inside an "Input type" message
    ("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same",
     {"kind": "device", "a": "cpu", "b": "cuda", "ordered": True}),
    ("Input type (CUDABFloat16Type) and weight type (CPUBFloat16Type) should be the same",
     {"kind": "device", "a": "cuda", "b": "cpu"}),
    ("Input type (CUDABFloat16Type) and weight type (torch.FloatTensor) should be the same",
     {"kind": "device", "a": "cuda", "b": "cpu", "dtypes": ("bfloat16", "float32")}),
    ("Input type (CUDABFloat16Type) and weight type (torch.cuda.HalfTensor) should be the same",
     {"kind": "dtype", "a": "bfloat16", "b": "float16"}),
    ("Input type (MPSFloatType) and weight type (MPSHalfType) should be the same", {"kind": "dtype", "a": "float32"}),
    ("expected scalar type BFloat16 but found Float", {"kind": "dtype", "a": "bfloat16", "b": "float32"}),
    ("expected scalar type Double but found Float", {"a": "float64", "b": "float32"}),
    # embedded in a longer text (a wrapper re-raising with context)
    ("Error in node X: mat1 and mat2 must have the same dtype, but got Half and Float (see log)",
     {"a": "float16", "b": "float32"}),
    ("RuntimeError: expected scalar type 'Float' but found 'Half'.", {"a": "float32", "b": "float16"}),
    ("mat1 and mat2 must have the same dtype, but got Float and Half. Cast your inputs.",
     {"a": "float32", "b": "float16"}),
    # not precision mismatches
    ("CUDA out of memory. Tried to allocate 2.00 MiB", None),
    ("expected scalar type Long but found Float", None),
    ("Input type (torch.FloatTensor) and weight type (torch.FloatTensor) should be the same", None),
    ("index_copy_(): self and source expected to have the same dtype, but got (self) Float and (source) Half", None),
    ("", None),
]


@pytest.mark.parametrize("message, expected", LITERALS, ids=[f"{i:02d}" for i in range(len(LITERALS))])
def test_parse_literal_messages(message, expected):
    _check(parse_mismatch(message), expected)


def test_every_family_is_covered():
    families = {parse_mismatch(m)["family"] for m, e in LITERALS if e is not None}
    assert families >= {"input_type", "mat1_mat2", "m1_m2", "scalar_type", "mixed_dtype_cpu", "sdpa",
                        "devices_found", "device_got", "expected_device"}


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
    assert "--set <component>.dtype=float16" in err.fix and "apply_recipe" in err.fix
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
    assert "`--set text_encoder.dtype=bfloat16`" in err.fix
    assert "components: {text_encoder: {dtype: bfloat16}}" in err.fix


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
    assert "`--set unet.dtype=float16` (YAML: components: {unet: {dtype: float16}})" in err.fix
    assert "load_pipeline" in err.fix and "apply_recipe" in err.fix
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
    with pytest.raises(TypeError, match="components"):
        explain("unet")


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


def test_doctests():
    result = doctest.testmod(explain_mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_no_torch_import_at_import_time():
    code = "import sys, hf_precision.mismatch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
