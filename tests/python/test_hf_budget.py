"""A device budget zoe.initialize accepts is one the training step fits: Hugging Face models whose
embedding is tied to their head (gemma2, gemma3_text, BERT's masked-LM decoder), where the
embedding's gradient buffer stays open through the whole backward, at the smallest
zoe.device_budget initialize accepts (found by bisection), train; a budget below it is refused at
initialize, naming zoe.device_budget. Tiny configs built with from_config: nothing is downloaded."""
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

from zoe_torch_models import config  # noqa: E402

VOCAB = 256
HIDDEN = 64
KIB = 1 << 10


def build(arch):
    T = transformers
    torch.manual_seed(0)
    dec = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=HIDDEN // 4)
    if arch == "gemma2":
        return T.AutoModelForCausalLM.from_config(T.Gemma2Config(**dec), attn_implementation="eager")
    if arch == "gemma3_text":
        return T.AutoModelForCausalLM.from_config(T.Gemma3TextConfig(**dec), attn_implementation="eager")
    if arch == "bert":
        return T.BertForMaskedLM(T.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=2 * HIDDEN,
                                              max_position_embeddings=64, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0))
    raise ValueError(arch)


def engine(arch, budget, tmp_path):
    return zoe.initialize(build(arch), config=config(tmp_path, device_budget=budget, micro=2, zero={
        "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0}))


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text", "bert"])
def test_smallest_budget_initialize_accepts_trains(arch, tmp_path):
    lo, hi = 64 * KIB, 4096 * KIB  # refused, accepted
    with pytest.raises(zoe.ZoeError, match="zoe.device_budget"):
        engine(arch, lo, tmp_path)
    engine(arch, hi, tmp_path).close()
    while hi - lo > 4 * KIB:
        mid = (lo + hi) // 2 // KIB * KIB
        try:
            engine(arch, mid, tmp_path).close()
            hi = mid
        except zoe.ZoeError as err:
            assert "zoe.device_budget" in str(err), str(err)
            lo = mid
    eng = engine(arch, hi, tmp_path)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, VOCAB, (2, 16), generator=g)
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)  # before the fix: out of budget in the first backward
        assert eng.step().stepped
        assert torch.isfinite(out.loss)
    assert eng.high_water()["device"] <= hi
    eng.close()
