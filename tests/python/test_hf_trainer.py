"""zoe.hf.Trainer, transformers' Trainer training through zoe's engine, on a tiny Llama built from a
LlamaConfig (nothing downloaded): the same losses, gradient norms and learning rates as
transformers.Trainer with its own AdamW; stopped at step 10 and resumed by a new Trainer, the
same losses bit for bit; save_model loaded by from_pretrained with the engine's logits;
TrainingArguments(deepspeed=...) with "auto" values; keys and arguments zoe cannot honour refused
by name; ZoeTrainerMixin under a Trainer subclass of its own."""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
zoe = pytest.importorskip("zoe", reason="the zoe Python package is not built (PYTHONPATH=<build>/python)")
os.environ["HF_HUB_OFFLINE"] = "1"

import zoe.hf  # noqa: E402

VOCAB = 128
ZOE = {"zero_optimization": {"stage": 3}}


def build(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False, attention_dropout=0.0)
    return transformers.LlamaForCausalLM(cfg)


class Tokens(torch.utils.data.Dataset):
    """n sequences of T random tokens, each its own labels."""

    def __init__(self, n=64, T=16, seed=1):
        self.x = torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def arguments(out, cls=None, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=20, learning_rate=3e-3,
                lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                report_to="none", save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    base.update(kw)
    return (cls or transformers.TrainingArguments)(**base)


def logged(trainer, key="loss"):
    return [h[key] for h in trainer.state.log_history if key in h and "train_loss" not in h]


def train(cls, args, model=None, **kw):
    t = cls(model=model if model is not None else build(), args=args, train_dataset=Tokens(),
            eval_dataset=Tokens(16, seed=2), **kw)
    t.train()
    return t


def rel(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


@pytest.mark.parametrize("accumulation", [1, 2])
def test_matches_transformers_trainer(tmp_path, accumulation):
    args = dict(gradient_accumulation_steps=accumulation, per_device_train_batch_size=4 // accumulation)
    ref = train(transformers.Trainer, arguments(tmp_path / "hf", **args))
    got = train(zoe.hf.Trainer, arguments(tmp_path / "zoe", **args), zoe_config=ZOE)
    assert len(logged(got)) == len(logged(ref)) == 20
    d_loss, d_norm = rel(logged(ref), logged(got)), rel(logged(ref, "grad_norm"), logged(got, "grad_norm"))
    print(f"accumulation {accumulation}: max relative difference over 20 steps: loss {d_loss:.2e}, "
          f"grad_norm {d_norm:.2e}")
    assert d_loss <= 1e-5 and d_norm <= 1e-5
    assert max(logged(ref, "grad_norm")) > 1.0  # clipping took part
    assert logged(got, "learning_rate") == logged(ref, "learning_rate")
    assert got.optimizer.state == {} and not any(isinstance(o, torch.optim.Optimizer) for o in vars(got).values())
    e_ref, e_got = ref.evaluate()["eval_loss"], got.evaluate()["eval_loss"]
    assert abs(e_ref - e_got) <= 1e-5 * e_ref


def test_resume_gives_the_uninterrupted_losses(tmp_path):
    whole = train(zoe.hf.Trainer, arguments(tmp_path / "whole"), zoe_config=ZOE)
    out = tmp_path / "run"
    first = train(zoe.hf.Trainer, arguments(out, max_steps=10, save_strategy="steps", save_steps=10), zoe_config=ZOE)
    ckpt = out / "checkpoint-10"
    assert {"trainer_state.json", "rng_state.pth", "latest", "global_step10", "model.safetensors"} <= set(
        os.listdir(ckpt))
    first.zoe_engine.close()
    # Another model's values: every one comes from the checkpoint.
    second = zoe.hf.Trainer(model=build(seed=7), args=arguments(out), train_dataset=Tokens(), zoe_config=ZOE)
    second.train(resume_from_checkpoint=True)
    assert logged(first) + logged(second)[10:] == logged(whole)  # bit for bit
    assert logged(second) == logged(whole)
    with pytest.raises(zoe.ZoeError, match="holds no zoe checkpoint"):
        other = zoe.hf.Trainer(model=build(), args=arguments(tmp_path / "x"), train_dataset=Tokens(), zoe_config=ZOE)
        other.train(resume_from_checkpoint=str(tmp_path))


def test_save_model_loads_with_the_engines_logits(tmp_path):
    t = train(zoe.hf.Trainer, arguments(tmp_path / "run", max_steps=5), zoe_config=ZOE)
    t.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    x = Tokens(4, seed=9).x
    t.zoe_engine.eval()
    with torch.no_grad():
        want = t.zoe_engine(input_ids=x).logits
        got = loaded(input_ids=x).logits
    assert (want - got).abs().max().item() <= 1e-6
    before = build()
    with torch.no_grad():
        assert (before(input_ids=x).logits - got).abs().max().item() > 1e-3  # trained


def ds_lr(step, lr, warmup, total):
    """DeepSpeed's WarmupDecayLR (linear warmup) at update `step` (its schedule at step-2)."""
    i = step - 2
    if i < 0:
        return 0.0
    if i < warmup:
        return lr * i / warmup
    return lr * max(0.0, (total - i) / max(1, total - warmup))


def test_deepspeed_config_with_auto_values(tmp_path):
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                    "weight_decay": "auto"}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                            "warmup_num_steps": "auto", "total_num_steps": "auto",
                                                            "warmup_type": "linear"}},
          "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                "stage3_param_persistence_threshold": "auto"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ds))
    for given in (ds, str(path)):
        args = arguments(tmp_path / "run", cls=zoe.hf.TrainingArguments, deepspeed=given, max_steps=12,
                         warmup_steps=4, max_grad_norm=0.5, adam_beta2=0.99)
        t = train(zoe.hf.Trainer, args)
        c = t.zoe_config
        assert c["train_micro_batch_size_per_gpu"] == 4 and c["train_batch_size"] == 4
        assert c["gradient_clipping"] == 0.5 and c["bf16"]["enabled"] is False
        assert c["optimizer"]["params"] == {"lr": 3e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0}
        assert c["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4,
                                            "total_num_steps": 12, "warmup_type": "linear"}
        assert c["zero_optimization"]["reduce_bucket_size"] == 32 * 32
        assert t.zoe_engine.config_value("optimizer.params.betas") == [0.9, 0.99]
        want = [ds_lr(k, 3e-3, 4, 12) for k in range(1, 13)]
        assert logged(t, "learning_rate") == pytest.approx(want, rel=1e-6, abs=1e-12)
        t.zoe_engine.close()


def test_transformers_training_arguments_deepspeed(tmp_path):
    """transformers' own TrainingArguments(deepspeed=...) needs DeepSpeed installed (its
    integration starts at construction); with it set, the Trainer takes the config and the same
    arguments without the integration."""
    args = arguments(tmp_path / "run", max_steps=3)
    args.deepspeed = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}
    t = train(zoe.hf.Trainer, args)
    assert t.args.deepspeed is None and t.zoe_config["train_micro_batch_size_per_gpu"] == 4
    assert len(logged(t)) == 3


@pytest.mark.parametrize("ds, kw, names", [
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "amsgrad": True}}}, {}, "optimizer.params.amsgrad"),
    ({"scheduler": {"type": "OneCycle", "params": {}}}, {}, "scheduler.type"),
    ({"train_micro_batch_size_per_gpu": 8}, {}, "train_micro_batch_size_per_gpu=8 but TrainingArguments "
                                                "per_device_train_batch_size=4"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}, {}, "optimizer.params.lr"),
    ({"zoe": {"offload_ratio": "auto"}}, {}, "zoe.offload_ratio"),
    ({}, {"lr_scheduler_type": "cosine"}, "lr_scheduler_type='cosine'"),
    ({}, {"optim": "sgd"}, "optim='sgd'"),
])
def test_refuses_what_it_cannot_honour(tmp_path, ds, kw, names):
    args = arguments(tmp_path / "run", cls=zoe.hf.TrainingArguments, deepspeed=ds or None, **kw)
    with pytest.raises(zoe.ZoeError) as e:
        zoe.hf.Trainer(model=build(), args=args, train_dataset=Tokens())
    assert names in str(e.value)


def test_refuses_a_torch_optimizer(tmp_path):
    model = build()
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(zoe.ZoeError, match="optimizers= is not taken"):
        zoe.hf.Trainer(model=model, args=arguments(tmp_path), train_dataset=Tokens(), optimizers=(opt, None))
    with pytest.raises(zoe.ZoeError, match="both zoe_config= and TrainingArguments deepspeed="):
        zoe.hf.Trainer(model=model, args=arguments(tmp_path, cls=zoe.hf.TrainingArguments, deepspeed=ZOE),
                       train_dataset=Tokens(), zoe_config=ZOE)


class AccuracyTrainer(transformers.Trainer):
    """A Trainer subclass of the kind TRL's SFTTrainer is: its own compute_loss (the token accuracy
    from the outputs, beside the loss) and a training_step around the Trainer's."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.accuracy = []
        self.steps = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, out = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            pred = out.logits[:, :-1].argmax(-1)
            self.accuracy.append((pred == inputs["labels"][:, 1:]).float().mean().item())
        return (loss, out) if return_outputs else loss

    def training_step(self, *a, **kw):
        self.steps += 1
        return super().training_step(*a, **kw)


class ZoeAccuracyTrainer(zoe.hf.ZoeTrainerMixin, AccuracyTrainer):
    pass


def test_mixin_under_a_trainer_subclass(tmp_path):
    ref = train(AccuracyTrainer, arguments(tmp_path / "hf", max_steps=10))
    got = train(ZoeAccuracyTrainer, arguments(tmp_path / "zoe", max_steps=10), zoe_config=ZOE)
    assert got.zoe_engine is not None and got.steps == ref.steps == 10
    assert rel(logged(ref), logged(got)) <= 1e-5
    assert got.accuracy == pytest.approx(ref.accuracy, abs=1e-6)
    assert math.isfinite(got.evaluate()["eval_loss"])


def test_muon_through_the_trainer(tmp_path):
    """optimizer.type "Muon" in zoe_config: the Trainer's loop trains through it (the loss falls),
    and the logged learning_rate is the matrices' rate (muon_lr) shaped by the Trainer's schedule
    (constant here: muon_lr itself at every step); the checkpoint records the optimizer."""
    cfg = {"zero_optimization": {"stage": 3},
           "optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 3e-3, "momentum": 0.95}}}
    out = tmp_path / "muon"
    got = train(zoe.hf.Trainer, arguments(out, max_steps=12, save_strategy="steps", save_steps=12), zoe_config=cfg)
    losses = logged(got)
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert logged(got, "learning_rate") == [0.02] * 12
    assert got.zoe_engine.config_value("optimizer.type") == "Muon"
    latest = (out / "checkpoint-12" / "latest").read_text().strip()
    manifest = json.loads((out / "checkpoint-12" / latest / "manifest.json").read_text())
    assert manifest["engine"]["optimizer"] == "Muon"


def test_adam_mini_through_the_trainer_matches_the_package(tmp_path):
    """optimizer.type "AdamMini" in zoe_config (its heads from the model's config): the Trainer's
    losses (as logged, 4 decimals) and final weights over 12 steps within 1e-5 of
    transformers.Trainer running the adam-mini package's Adam_mini on the same model, data,
    clipping and schedule (with n_heads 2 in the package the weights end 5.5e-3 away)."""
    adam_mini = pytest.importorskip("adam_mini", reason="the adam-mini package is not installed")
    cfg = {"zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamMini", "params": {"lr": 3e-3}}}  # weight_decay: the TrainingArguments'
    got = train(zoe.hf.Trainer, arguments(tmp_path / "zoe", max_steps=12, weight_decay=0.1), zoe_config=cfg)
    model = build()
    opt = adam_mini.Adam_mini(named_parameters=model.named_parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8,
                              weight_decay=0.1, dim=32, n_heads=4, n_kv_heads=2, verbose=False)
    ref = train(transformers.Trainer, arguments(tmp_path / "hf", max_steps=12, weight_decay=0.1), model=model,
                optimizers=(opt, None))
    losses = logged(got)
    sd = got.zoe_engine.state_dict()
    weights = max((sd[n] - p.detach()).abs().max().item() for n, p in model.named_parameters())
    print(f"\nAdam-mini through the Trainer vs the package over 12 steps: loss {rel(logged(ref), losses):.2e} "
          f"relative, weights {weights:.2e}")
    assert len(losses) == 12 and losses[-1] < losses[0], losses
    assert rel(logged(ref), losses) <= 1e-5 and weights <= 1e-5
    assert got.zoe_engine.config_value("optimizer.params.n_heads") == 4
