"""task_encoder/ and pipeline/hooks.py: hooks and defaults, conversions, cookers, @stateless / call_hook, hook_spec."""

from __future__ import annotations

import dataclasses
import pickle
import random
import types
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from megatron_energon_lite.decode import SampleDecoder
from megatron_energon_lite.errors import ConfigError, SkipSample
from megatron_energon_lite.pipeline.hooks import (
    HOOK_NAMES,
    call_hook,
    hook_seed,
    hook_spec,
)
from megatron_energon_lite.samples import (
    Batch,
    CrudeSample,
    Sample,
    SourceInfo,
    TextSample,
    generic_batch,
)
from megatron_energon_lite.energon.task_encoder import (
    Cooker,
    DefaultTaskEncoder,
    TaskEncoder,
    basic_sample_keys,
    cooker,
    hook_context,
    stateless,
)
from megatron_energon_lite.pipeline.cooking import select_cooker
from megatron_energon_lite.pipeline.marks import StatelessSpec, stateless_spec


def energon():
    return pytest.importorskip("megatron.energon")


@dataclasses.dataclass(kw_only=True, slots=True)
class Captioned(Sample):
    image: Any
    caption: str


def captioned(i: int, *, width: int | None = None, subflavors: dict | None = None) -> Captioned:
    return Captioned(
        __key__=f"k{i}",
        __restore_key__=("Webdataset", i),
        __subflavors__=subflavors,
        image=torch.full((2, width or i + 1), float(i)),
        caption=f"caption {i}",
    )


def draws() -> tuple[float, float, float]:
    """One draw from each global generator."""
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


# ---------------------------------------------------------------------------- defaults


def test_task_encoder_defaults() -> None:
    te = TaskEncoder()
    sample = captioned(0)
    assert te.encode_sample(sample) is sample
    assert te.preencode_sample(sample) is sample
    assert te.postencode_sample(sample) is sample
    assert te.encode_batch(sample) is sample
    assert te.batch_group_criterion(sample) == (None, None)
    assert isinstance(TaskEncoder.decoder, SampleDecoder)
    assert TaskEncoder.cookers == ()
    assert TaskEncoder.__default_failure_tolerance__ == 100
    with pytest.raises(NotImplementedError):
        te.select_samples_to_pack([sample])
    with pytest.raises(NotImplementedError):
        te.pack_selected_samples([sample])


def test_task_encoder_batch_is_generic_batch() -> None:
    te = TaskEncoder()
    samples = [captioned(i, subflavors={"s": i}) for i in range(3)]
    batch = te.batch(samples)
    assert type(batch) is Captioned
    assert batch.caption == [s.caption for s in samples]
    assert batch.image.shape == (3, 2, 3)
    for i, s in enumerate(samples):
        assert torch.equal(batch.image[i, :, : s.image.shape[1]], s.image)
    # TaskEncoder batches subflavors like any dict field (Energon's behaviour).
    assert batch.__subflavors__ == {"s": [0, 1, 2]}
    tensors = [torch.ones(2), torch.ones(3)]
    assert torch.equal(te.batch(tensors), generic_batch(tensors))


def test_default_task_encoder_batch_keeps_subflavors_as_a_list() -> None:
    samples = [captioned(i, width=2, subflavors={"s": i} if i else None) for i in range(3)]
    batch = DefaultTaskEncoder().batch(samples)
    assert type(batch) is Captioned
    assert batch.__subflavors__ == [None, {"s": 1}, {"s": 2}]
    assert torch.equal(batch.image, torch.stack([s.image for s in samples]))
    assert batch.__key__ == ["k0", "k1", "k2"]


# ---------------------------------------------------------------------------- conversions


@dataclasses.dataclass
class Encoded:
    __key__: str
    __restore_key__: tuple
    __subflavors__: Any
    __sources__: Any
    image: Any
    caption: str


class EncodedTuple(NamedTuple):
    image: Any
    caption: str


@dataclasses.dataclass(kw_only=True, slots=True)
class CaptionBatch(Batch):
    image: Any
    caption: list


@dataclasses.dataclass
class FinalBatch:
    __key__: list
    __restore_key__: Any
    __subflavors__: Any
    __sources__: Any
    image: Any
    caption: list


def as_pair(sample: Captioned) -> dict[str, Any]:
    return {"image": sample.image, "caption": sample.caption}


@pytest.mark.parametrize("target", [Encoded, EncodedTuple, dict])
def test_encode_sample_converts_by_field_name(target: type) -> None:
    # Namedtuple fields cannot start with "_", so the namedtuple target converts a dict sample.
    sample = as_pair(captioned(1)) if target is EncodedTuple else captioned(1)
    out = DefaultTaskEncoder(encoded_sample_type=target).encode_sample(sample)
    fields = _fields(sample)
    if target is dict:
        assert out == fields
    else:
        assert type(out) is target
        assert {name: getattr(out, name) for name in fields} == fields


def test_encode_sample_keeps_samples_of_the_target_type_and_without_one() -> None:
    sample = captioned(1)
    assert DefaultTaskEncoder(encoded_sample_type=Captioned).encode_sample(sample) is sample
    assert DefaultTaskEncoder().encode_sample(sample) is sample


def test_conversion_error_names_the_differing_fields() -> None:
    @dataclasses.dataclass
    class Other:
        image: Any
        text: str

    with pytest.raises(ConfigError) as info:
        DefaultTaskEncoder(encoded_sample_type=Other).encode_sample(captioned(1))
    message = str(info.value)
    assert "caption" in message and "text" in message and "__key__" in message
    with pytest.raises(ConfigError, match="must be a dataclass"):
        DefaultTaskEncoder(batch_type=int)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="by field name"):
        DefaultTaskEncoder(encoded_sample_type=Encoded).encode_sample(3)


def test_raw_batch_type_and_batch_type() -> None:
    samples = [captioned(i) for i in range(2)]
    te = DefaultTaskEncoder(raw_batch_type=CaptionBatch, batch_type=FinalBatch)
    raw = te.batch(samples)
    assert type(raw) is CaptionBatch
    assert raw.__key__ == ["k0", "k1"] and raw.caption == ["caption 0", "caption 1"]
    final = te.encode_batch(raw)
    assert type(final) is FinalBatch
    assert final.image is raw.image and final.__key__ == raw.__key__
    same = DefaultTaskEncoder(raw_batch_type=CaptionBatch, batch_type=CaptionBatch)
    assert same.encode_batch(raw) is raw
    assert DefaultTaskEncoder(batch_type=dict).encode_batch(raw)["caption"] == raw.caption


def test_raw_batch_type_dict_and_namedtuple_samples() -> None:
    samples = [EncodedTuple(torch.ones(2), f"c{i}") for i in range(2)]
    out = DefaultTaskEncoder(raw_batch_type=dict).batch(samples)
    assert type(out) is dict and out["caption"] == ["c0", "c1"] and out["image"].shape == (2, 2)
    tuples = DefaultTaskEncoder().batch(samples)
    assert type(tuples) is EncodedTuple and tuples.caption == ["c0", "c1"]


def _mirror(e: Any, sample: Captioned) -> Any:
    @e.edataclass
    class ECaptioned(e.Sample):
        image: Any
        caption: str

    return ECaptioned(
        __key__=sample.__key__,
        __restore_key__=sample.__restore_key__,
        __subflavors__=sample.__subflavors__,
        __sources__=sample.__sources__,
        image=sample.image,
        caption=sample.caption,
    )


def _fields(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return value._asdict()
    return dict(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.energon
@pytest.mark.parametrize("encoder", ["TaskEncoder", "DefaultTaskEncoder"])
@pytest.mark.parametrize("widths", [(2, 2, 2), (1, 3, 2)])
def test_default_batching_matches_energon(encoder: str, widths: tuple[int, ...]) -> None:
    e = energon()
    ours = [captioned(i, width=w, subflavors={"s": i}) for i, w in enumerate(widths)]
    theirs = [_mirror(e, s) for s in ours]
    mine = {"TaskEncoder": TaskEncoder, "DefaultTaskEncoder": DefaultTaskEncoder}[encoder]().batch(ours)
    ref = getattr(e, encoder)().batch(theirs)
    assert type(mine).__name__ == "Captioned" and type(ref).__name__ == "ECaptioned"
    a, b = _fields(mine), _fields(ref)
    assert a.keys() == b.keys()
    for name in a:
        assert _same(a[name], b[name]), name


@pytest.mark.energon
@pytest.mark.parametrize("target", [Encoded, EncodedTuple, dict])
def test_conversions_match_energon(target: type) -> None:
    e = energon()
    samples = [as_pair(captioned(i)) if target is EncodedTuple else captioned(i) for i in range(2)]
    mine = [DefaultTaskEncoder(encoded_sample_type=target).encode_sample(s) for s in samples]
    ref = [e.DefaultTaskEncoder(encoded_sample_type=target).encode_sample(s) for s in samples]
    for a, b in zip(mine, ref):
        assert type(a) is type(b) and _same(_fields(a), _fields(b))
    raw = DefaultTaskEncoder(raw_batch_type=dict).batch(mine)
    ref_raw = e.DefaultTaskEncoder(raw_batch_type=dict).batch(ref)
    assert _same(raw, ref_raw)
    final_type = EncodedTuple if target is EncodedTuple else FinalBatch
    final = DefaultTaskEncoder(raw_batch_type=dict, batch_type=final_type).encode_batch(raw)
    ref_final = e.DefaultTaskEncoder(raw_batch_type=dict, batch_type=final_type).encode_batch(ref_raw)
    assert type(final) is type(ref_final) and _same(_fields(final), _fields(ref_final))


# ---------------------------------------------------------------------------- cookers


@stateless
def cook_text(crude: dict, **aux: Any) -> TextSample:
    return TextSample(**basic_sample_keys(crude), text=crude["txt"] + "".join(f"+{k}" for k in sorted(aux)))


@stateless
def cook_upper(crude: dict) -> TextSample:
    return TextSample(**basic_sample_keys(crude), text=crude["txt"].upper())


def crude(subflavors: dict | None, **parts: Any) -> CrudeSample:
    sample = CrudeSample(__key__="k", __restore_key__=("Webdataset", 3), __subflavors__=subflavors, __sources__=None)
    sample.update(parts)
    return sample


class CookingEncoder(TaskEncoder):
    cookers = [Cooker(cook_upper, has_subflavors={"style": "loud", "lang": "en"}), Cooker(cook_text)]


def test_cook_crude_sample_chooses_the_first_matching_cooker() -> None:
    te = CookingEncoder()
    loud = te.cook_crude_sample(crude({"style": "loud", "lang": "en", "extra": 1}, txt="hi"))
    assert loud.text == "HI"
    assert (loud.__key__, loud.__restore_key__, loud.__subflavors__) == ("k", ("Webdataset", 3), {"style": "loud", "lang": "en", "extra": 1})
    assert te.cook_crude_sample(crude({"style": "loud"}, txt="hi")).text == "hi"
    assert te.cook_crude_sample(crude(None, txt="hi")).text == "hi"
    assert te.cook_crude_sample(crude(None, txt="hi"), Cooker(cook_text), {"aux1": object()}).text == "hi+aux1"


def test_cooker_matching() -> None:
    c = Cooker(cook_text, has_subflavors={"a": 1, "b": None})
    assert c.is_match({"a": 1, "b": None, "c": 2})
    assert not c.is_match({"a": 1})
    assert not c.is_match({"a": 2, "b": None})
    assert not c.is_match(None)
    assert Cooker(cook_text).is_match(None)
    with pytest.raises(ConfigError):
        Cooker(cook_text, has_subflavors=["a"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Cooker("cook")  # type: ignore[arg-type]


def test_no_matching_cooker_names_subflavors_and_cookers() -> None:
    class OnlyLoud(TaskEncoder):
        cookers = [Cooker(cook_upper, has_subflavors={"style": "loud"})]

    with pytest.raises(ConfigError) as info:
        OnlyLoud().cook_crude_sample(crude({"style": "quiet"}, txt="x"))
    message = str(info.value)
    assert "'style': 'quiet'" in message and "cook_upper" in message and "'loud'" in message


def test_crude_sample_without_cookers_explains_how_to_add_one() -> None:
    with pytest.raises(ConfigError) as info:
        TaskEncoder().cook_crude_sample(crude(None, txt="x"))
    assert "cookers = [Cooker(" in str(info.value)
    assert "@stateless" in str(info.value)


def test_select_cooker_checks_stateless_and_keeps_the_flags() -> None:
    def plain(crude: dict) -> TextSample:
        return TextSample(**basic_sample_keys(crude), text="")

    with pytest.raises(ConfigError, match="not marked @stateless"):
        select_cooker([Cooker(plain)], {}, where="/data/ds")

    @stateless
    @cooker(need_primary=True)
    def primary(crude: dict, primary: Any) -> TextSample:
        raise AssertionError("not called")

    @cooker(need_cache=True)
    @stateless
    def cached(crude: dict, cache: Any) -> TextSample:
        raise AssertionError("not called")

    assert Cooker(primary).need_primary and not Cooker(primary).need_cache
    assert Cooker(cached).need_cache and not Cooker(cached).need_primary
    for fn in (primary, cached):  # chosen like any other cooker (the loader passes primary / cache)
        assert select_cooker([Cooker(fn)], None).cook is fn
    assert select_cooker([Cooker(primary, has_subflavors={"x": 1}), Cooker(cook_text)], {}).cook is cook_text


def test_basic_sample_keys() -> None:
    src = SourceInfo("/d", 1, "s.tar", ("k.txt",))
    extra = SourceInfo("/aux", 2, "a.tar", ("k.jpg",))
    c = crude({"a": 1}, txt="x")
    c["__sources__"] = (src,)
    c["__shard__"] = "s.tar"
    assert basic_sample_keys(c) == {"__key__": "k", "__restore_key__": ("Webdataset", 3), "__subflavors__": {"a": 1}, "__sources__": (src,)}
    assert basic_sample_keys(c, (extra,))["__sources__"] == (src, extra)
    assert basic_sample_keys({"__key__": "k"}, (extra,)) == {"__key__": "k", "__sources__": (extra,)}


@pytest.mark.energon
def test_basic_sample_keys_matches_energon() -> None:
    e = energon()
    src = SourceInfo("/d", 1, "s.tar", ("k.txt",))
    c = crude({"a": 1}, txt="x")
    c["__sources__"] = (src,)
    assert basic_sample_keys(c) == e.basic_sample_keys(c)
    assert basic_sample_keys(c, (src,)) == e.basic_sample_keys(c, (src,))


# ---------------------------------------------------------------------------- stateless / call_hook


def test_stateless_marks_without_wrapping() -> None:
    def fn(x: int) -> int:
        return x

    assert stateless(fn) is fn
    assert stateless_spec(fn) == StatelessSpec(restore_seeds=False, failure_tolerance=None)
    g = stateless(restore_seeds=True, failure_tolerance=0)(lambda x: x)
    assert stateless_spec(g) == StatelessSpec(restore_seeds=True, failure_tolerance=0)
    assert stateless_spec(lambda x: x) is None
    with pytest.raises(ConfigError):
        stateless(failure_tolerance=-1)
    with pytest.raises(ConfigError):
        stateless(restore_seeds="yes")  # type: ignore[arg-type]


class Augment(TaskEncoder):
    @stateless(restore_seeds=True, failure_tolerance=7)
    def encode_sample(self, sample: Any) -> Any:
        return (self.current_sample_index, *draws())

    @stateless(restore_seeds=True)
    def preencode_sample(self, sample: Any) -> Any:
        for _ in range(3):
            yield (self.current_sample_index, *draws())

    @stateless
    def postencode_sample(self, sample: Any) -> Any:
        return draws()

    @stateless(restore_seeds=True)
    def batch(self, samples: list[Any]) -> Any:
        raise SkipSample()


def test_restore_seeds_gives_the_same_draws_for_the_same_sample_index() -> None:
    te = Augment()
    first = call_hook(te.encode_sample, "s", sample_index=5, worker_seed=11)
    draws()  # move the outer generators on
    again = call_hook(te.encode_sample, "s", sample_index=5, worker_seed=11)
    assert first == again and first[0] == 5
    assert call_hook(te.encode_sample, "s", sample_index=6, worker_seed=11)[1:] != first[1:]
    assert call_hook(te.encode_sample, "s", sample_index=5, worker_seed=12)[1:] != first[1:]
    # The draws are those of the global generators seeded with hook_seed(worker_seed, index).
    seed_all(hook_seed(11, 5))
    assert draws() == first[1:]


def test_restore_seeds_leaves_the_outer_rng_untouched() -> None:
    te = Augment()
    seed_all(123)
    expected = [draws() for _ in range(3)]
    seed_all(123)
    seen = []
    for i in range(3):
        call_hook(te.encode_sample, "s", sample_index=i, worker_seed=1)
        seen.append(draws())
    assert seen == expected
    # Also when the hook raises.
    seed_all(123)
    with pytest.raises(SkipSample):
        call_hook(te.batch, ["s"], sample_index=0, worker_seed=1)
    assert draws() == expected[0]


def test_hooks_without_restore_seeds_use_the_outer_rng() -> None:
    te = Augment()
    seed_all(5)
    expected = draws()
    seed_all(5)
    assert call_hook(te.postencode_sample, "s", sample_index=0, worker_seed=1) == expected


def test_generator_hook_steps_keep_their_own_stream_and_the_outer_one() -> None:
    te = Augment()
    whole = list(call_hook(te.preencode_sample, "s", sample_index=9, worker_seed=2))
    seed_all(hook_seed(2, 9))
    assert whole == [(9, *draws()) for _ in range(3)]  # one continuous seeded stream

    seed_all(77)
    expected_outer = [draws() for _ in range(4)]
    seed_all(77)
    outputs = call_hook(te.preencode_sample, "s", sample_index=9, worker_seed=2)
    assert isinstance(outputs, types.GeneratorType)
    stepped, outer = [], [draws()]
    for item in outputs:
        stepped.append(item)
        # Another hook call between steps must not disturb either stream.
        call_hook(te.encode_sample, "t", sample_index=100, worker_seed=2)
        outer.append(draws())
    assert stepped == whole
    assert outer == expected_outer


def test_generator_hook_sees_its_own_sample_index_when_stepped_later() -> None:
    class Gen(TaskEncoder):
        def encode_sample(self, sample: Any) -> Any:
            yield self.current_sample_index
            yield self.current_sample_index

    te = Gen()
    a = call_hook(te.encode_sample, "a", sample_index=1, worker_seed=0)
    b = call_hook(te.encode_sample, "b", sample_index=2, worker_seed=0)
    assert [next(b), next(a), next(b), next(a)] == [2, 1, 2, 1]
    with pytest.raises(StopIteration):
        next(a)


def test_closing_a_generator_hook_early_runs_its_cleanup_in_context() -> None:
    seen: list[Any] = []

    class Gen(TaskEncoder):
        @stateless(restore_seeds=True)
        def encode_sample(self, sample: Any) -> Any:
            try:
                for _ in range(5):
                    yield torch.rand(1).item()
            finally:
                seen.append((self.current_sample_index, torch.rand(1).item()))

    seed_all(3)
    expected_outer = draws()
    seed_all(3)
    outputs = call_hook(Gen().encode_sample, "s", sample_index=4, worker_seed=1)
    first = next(outputs)
    outputs.close()
    assert draws() == expected_outer
    seed_all(hook_seed(1, 4))
    assert first == torch.rand(1).item()
    assert seen == [(4, torch.rand(1).item())]  # the cleanup continued the hook's own stream


def test_plain_function_returning_a_generator_is_stepped_too() -> None:
    @stateless(restore_seeds=True)
    def fn(x: int) -> Any:
        first = torch.rand(1).item()
        return (first + torch.rand(1).item() * 0 for _ in range(2))

    out = call_hook(fn, 1, sample_index=3, worker_seed=4)
    assert isinstance(out, types.GeneratorType)
    values = list(out)
    seed_all(hook_seed(4, 3))
    assert values == [torch.rand(1).item()] * 2


def test_current_indices_and_hook_context() -> None:
    te = Augment()
    with pytest.raises(ConfigError, match="current_sample_index"):
        te.current_sample_index
    with pytest.raises(ConfigError, match="current_batch_index"):
        te.current_batch_index

    class Both(TaskEncoder):
        def encode_batch(self, batch: Any) -> Any:
            return self.current_sample_index, self.current_batch_index

    both = Both()
    with hook_context(batch_index=4):
        assert call_hook(both.encode_batch, None, sample_index=8, worker_seed=0) == (8, 4)
        with hook_context(sample_index=1):
            assert (both.current_sample_index, both.current_batch_index) == (1, 4)
        assert both.current_batch_index == 4
        with pytest.raises(ConfigError):
            both.current_sample_index
    with pytest.raises(ConfigError):
        both.current_batch_index


@pytest.mark.energon
def test_hook_seed_is_energons() -> None:
    rng = pytest.importorskip("megatron.energon.rng")
    for worker_seed, index in ((0, 0), (273211461, 17), (2**32 - 1, 10**9)):
        assert hook_seed(worker_seed, index) == rng.SystemRng.get_seed_from_args(worker_seed, index)


def test_cooker_with_restore_seeds_is_seeded_inside_cook_crude_sample() -> None:
    @stateless(restore_seeds=True)
    def cook_random(crude: dict) -> TextSample:
        return TextSample(**basic_sample_keys(crude), text=str(torch.rand(1).item()))

    class Cooking(TaskEncoder):
        cookers = [Cooker(cook_random)]

    te = Cooking()
    a = call_hook(te.cook_crude_sample, crude(None), sample_index=3, worker_seed=9)
    b = call_hook(te.cook_crude_sample, crude(None), sample_index=3, worker_seed=9)
    assert a.text == b.text
    seed_all(hook_seed(9, 3))
    assert a.text == str(torch.rand(1).item())


# ---------------------------------------------------------------------------- hook_spec


def test_hook_spec_of_the_defaults() -> None:
    spec = hook_spec(TaskEncoder())
    assert [h.name for h in spec.hooks] == list(HOOK_NAMES)
    assert not any(h.overridden for h in spec.hooks)
    assert (spec.sample_encoder, spec.postencoder, spec.packing, spec.grouping, spec.batch_encoder) == (None, False, False, False, False)
    assert spec["batch"].stateless and not spec["batch_group_criterion"].stateless
    assert all(h.failure_tolerance == 100 for h in spec.hooks)

    default = hook_spec(DefaultTaskEncoder())
    assert {h.name for h in default.hooks if h.overridden} == {"encode_sample", "batch", "encode_batch"}
    assert default.sample_encoder is None and not default.batch_encoder  # identities are skipped
    converting = hook_spec(DefaultTaskEncoder(encoded_sample_type=dict, raw_batch_type=dict, batch_type=FinalBatch))
    assert converting.sample_encoder == "encode_sample" and converting.batch_encoder
    assert not hook_spec(DefaultTaskEncoder(raw_batch_type=dict, batch_type=dict)).batch_encoder


def test_hook_spec_reads_overrides_and_stateless_specs() -> None:
    class Packing(DefaultTaskEncoder):
        __default_failure_tolerance__ = 0

        @stateless(restore_seeds=True, failure_tolerance=3)
        def preencode_sample(self, sample: Any) -> Any:
            yield sample

        def select_samples_to_pack(self, samples: list) -> list:
            return [samples]

        @stateless
        def pack_selected_samples(self, samples: list) -> Any:
            return samples[0]

        def batch_group_criterion(self, sample: Any) -> Any:
            return "all", 4

    spec = hook_spec(Packing())
    assert spec.sample_encoder == "preencode_sample"
    assert spec.packing and spec.grouping and not spec.postencoder
    pre = spec["preencode_sample"]
    assert (pre.overridden, pre.stateless, pre.restore_seeds, pre.failure_tolerance, pre.generator) == (True, True, True, 3, True)
    assert spec["select_samples_to_pack"].failure_tolerance == 0 and not spec["select_samples_to_pack"].stateless
    assert spec["pack_selected_samples"].stateless
    assert spec.default_failure_tolerance == 0
    assert pickle.loads(pickle.dumps(spec)).hooks == spec.hooks
    # DefaultTaskEncoder.encode_sample counts as overridden (Energon's meaning), but preencode wins.
    assert spec.overridden("preencode_sample") and spec.overridden("encode_sample")
    assert not spec.overridden("postencode_sample")
    assert spec.tolerance("preencode_sample") == 3 and spec.tolerance("batch") == 0
    assert not spec.cooks and hook_spec(CookingEncoder()).cooks
    assert hook_spec(CookingEncoder()).cookers == tuple(CookingEncoder.cookers)
    with pytest.raises(KeyError):
        spec["nope"]

    te = TaskEncoder()
    te.encode_batch = lambda batch: batch  # an instance attribute counts as an override
    assert hook_spec(te).batch_encoder and hook_spec(te)["encode_batch"].overridden


def test_hook_spec_rejects_encode_and_preencode_together() -> None:
    class Both(TaskEncoder):
        def encode_sample(self, sample: Any) -> Any:
            return sample

        def preencode_sample(self, sample: Any) -> Any:
            return sample

    with pytest.raises(ConfigError, match="both encode_sample and preencode_sample"):
        hook_spec(Both())


@pytest.mark.parametrize("name", ["select_samples_to_pack", "pack_selected_samples"])
def test_hook_spec_rejects_a_single_packing_hook(name: str) -> None:
    cls = type("OnePack", (TaskEncoder,), {name: lambda self, samples: samples})
    other = ({"select_samples_to_pack", "pack_selected_samples"} - {name}).pop()
    with pytest.raises(ConfigError, match=f"overrides {name} but not {other}"):
        hook_spec(cls())


def test_hook_spec_rejects_bad_settings() -> None:
    bad_cookers = type("BadCookers", (TaskEncoder,), {"cookers": [cook_text]})
    with pytest.raises(ConfigError, match="list of Cooker"):
        hook_spec(bad_cookers())
    bad_decoder = type("BadDecoder", (TaskEncoder,), {"decoder": object()})
    with pytest.raises(ConfigError, match="SampleDecoder"):
        hook_spec(bad_decoder())
    assert hook_spec(type("Raw", (TaskEncoder,), {"decoder": None})()).decoder is None
    bad_tolerance = type("BadTolerance", (TaskEncoder,), {"__default_failure_tolerance__": -3})
    with pytest.raises(ConfigError, match="failure tolerance"):
        hook_spec(bad_tolerance())
    none_tolerance = type("NoneTolerance", (TaskEncoder,), {"__default_failure_tolerance__": None})
    assert hook_spec(none_tolerance())["batch"].failure_tolerance == 0
    with pytest.raises(ConfigError, match="derive from"):
        hook_spec(object())  # type: ignore[arg-type]


def test_hook_spec_rejects_energons_stateless() -> None:
    def encode(self: Any, sample: Any) -> Any:
        return sample

    encode.__stateless__ = True  # what megatron.energon's @stateless leaves on a function
    cls = type("Mixed", (TaskEncoder,), {"encode_sample": encode})
    with pytest.raises(ConfigError, match="megatron_energon_lite"):
        hook_spec(cls())


@pytest.mark.energon
def test_overridden_matches_energon() -> None:
    e = energon()

    def make(base: type, stateless_fn: Any) -> list[Any]:
        class A(base):
            @stateless_fn
            def encode_sample(self, sample: Any) -> Any:
                return sample

            def batch_group_criterion(self, sample: Any) -> Any:
                return None, None

        class B(base):
            def preencode_sample(self, sample: Any) -> Any:
                return sample

            def postencode_sample(self, sample: Any) -> Any:
                return sample

            def select_samples_to_pack(self, samples: list) -> list:
                return [samples]

            def pack_selected_samples(self, samples: list) -> Any:
                return samples[0]

        return [A(), B(), base()]

    for lite_base, e_base in ((TaskEncoder, e.TaskEncoder), (DefaultTaskEncoder, e.DefaultTaskEncoder)):
        for ours, theirs in zip(make(lite_base, stateless), make(e_base, e.stateless)):
            spec = hook_spec(ours)
            for name in HOOK_NAMES:
                assert spec[name].overridden == theirs._is_overridden(getattr(theirs, name)), (type(ours), name)
