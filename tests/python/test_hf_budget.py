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


def test_stage3_llama_on_nvme_serves_its_partitions_in_place(tmp_path):
    """One process (world size 1), stage 3, parameters and states on NVMe: a module in use is its
    partition, pinned on the device, with no gathered copy beside it, so the device holds a module and
    its gradients. A 3-layer Llama (hidden 64) trains under a 512 KiB device budget (a gathered copy
    asked 552 KiB here), its device high-water mark stays within it, and its losses and weights are
    plain torch's."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False)

    def model():
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (2, 16), generator=g) for _ in range(4)]
    ref = model()
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    ref_losses = []
    for ids in batches:
        opt.zero_grad(set_to_none=True)
        loss = ref(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        ref_losses.append(loss.item())
    eng = zoe.initialize(model(), config=config(tmp_path, device_budget=512 * KIB, micro=2))
    losses = []
    for ids in batches:
        out = eng(input_ids=ids, labels=ids)
        eng.backward(out.loss)
        assert eng.step().stepped
        losses.append(out.loss.item())
    assert eng.high_water()["device"] <= 512 * KIB
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, ref_losses)
    got = dict(eng.gathered_parameters())
    for n, p in ref.named_parameters():
        assert (got[n] - p.detach()).abs().max().item() <= 1e-5, n
    eng.close()
