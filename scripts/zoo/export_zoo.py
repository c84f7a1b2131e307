#!/usr/bin/env python3
"""Regenerate the robustness zoo: real torchvision / Hugging Face exports.

Needs torch, torchvision, transformers, onnxscript, onnx (CPU is enough):

    python3 -m venv /tmp/zoo/venv
    /tmp/zoo/venv/bin/pip install torch torchvision transformers onnxscript onnx onnxruntime
    /tmp/zoo/venv/bin/python scripts/zoo/export_zoo.py /tmp/zoo/models [NAME_FILTER]

Every model is exported with the legacy TorchScript exporter (dynamo=False)
and the dynamo exporter (dynamo=True), at opsets 17 and 18, with fixed and
with dynamic (batch / seq) axes; a few legacy exports also in training mode
without constant folding. Models are random-initialized with small configs
(no downloads). Files go to OUT/{model}-{exporter}-op{opset}-{fixed|dyn}[-train].onnx;
failures to export are listed in OUT/export_failures.txt, not fatal.
"""
import os
import sys
import traceback
import warnings

import torch

warnings.filterwarnings("ignore")
torch.manual_seed(0)


def tv_models():
    import torchvision.models as M

    # Batch 2: with batch 1, torch.export specializes the dynamic batch to 1.
    img = lambda s=64: torch.randn(2, 3, s, s)
    yield "resnet18", lambda: M.resnet18(), img(), ["x"], {"x": {0: "batch"}}
    yield "mobilenet_v3_small", lambda: M.mobilenet_v3_small(), img(), ["x"], {"x": {0: "batch"}}
    yield "efficientnet_b0", lambda: M.efficientnet_b0(), img(), ["x"], {"x": {0: "batch"}}
    yield "convnext_tiny", lambda: M.convnext_tiny(), img(), ["x"], {"x": {0: "batch"}}
    yield "densenet121", lambda: M.densenet121(), img(), ["x"], {"x": {0: "batch"}}
    yield "regnet_y_400mf", lambda: M.regnet_y_400mf(), img(), ["x"], {"x": {0: "batch"}}
    yield "vit_b_16", lambda: M.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128), img(32), ["x"], {"x": {0: "batch"}}
    yield "swin_t", lambda: M.swin_t(), img(64), ["x"], {"x": {0: "batch"}}
    yield "inception_v3", lambda: M.inception_v3(aux_logits=False, init_weights=False), img(96), ["x"], {"x": {0: "batch"}}
    yield "shufflenet", lambda: M.shufflenet_v2_x0_5(), img(), ["x"], {"x": {0: "batch"}}
    yield "googlenet", lambda: M.googlenet(aux_logits=False, init_weights=False), img(), ["x"], {"x": {0: "batch"}}


class Wrap(torch.nn.Module):
    """Return a plain tensor (first output) from a HF model."""

    def __init__(self, m, key="last_hidden_state"):
        super().__init__()
        self.m, self.key = m, key

    def forward(self, *args):
        out = self.m(*args)
        return out[self.key] if isinstance(out, dict) or hasattr(out, "keys") else out[0]


def hf_models():
    import transformers as T

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100)
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    seqdyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    yield "bert", lambda: Wrap(T.BertModel(T.BertConfig(**small))), (ids, mask), ["input_ids", "attention_mask"], seqdyn
    yield "distilbert", lambda: Wrap(T.DistilBertModel(T.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=100))), (ids, mask), ["input_ids", "attention_mask"], seqdyn
    yield "roberta", lambda: Wrap(T.RobertaModel(T.RobertaConfig(**small))), (ids, mask), ["input_ids", "attention_mask"], seqdyn
    yield "gpt2", lambda: Wrap(T.GPT2Model(T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, use_cache=False))), (ids,), ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}
    yield "t5enc", lambda: Wrap(T.T5EncoderModel(T.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4, vocab_size=100))), (ids,), ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}
    yield "llama", lambda: Wrap(T.LlamaModel(T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=100, use_cache=False))), (ids, mask), ["input_ids", "attention_mask"], seqdyn
    yield "hfvit", lambda: Wrap(T.ViTModel(T.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8))), (torch.randn(2, 3, 32, 32),), ["pixel_values"], {"pixel_values": {0: "batch"}}
    yield "whisper_enc", lambda: Wrap(T.WhisperModel(T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50, vocab_size=100)).get_encoder()), (torch.randn(2, 16, 100),), ["input_features"], {"input_features": {0: "batch"}}


def export(name, make, args, in_names, dyn, out_dir, dynamo, opset, dynamic, train=False):
    tag = f"{name}-{'dynamo' if dynamo else 'legacy'}-op{opset}-{'dyn' if dynamic else 'fixed'}{'-train' if train else ''}"
    path = os.path.join(out_dir, tag + ".onnx")
    if os.path.exists(path):
        return tag, None
    torch.manual_seed(0)
    m = make()
    m.train(train)
    if not isinstance(args, tuple):
        args = (args,)
    kw = dict(input_names=in_names, output_names=["y"], opset_version=opset)
    if dynamo:
        if dynamic:
            ds = tuple({k: torch.export.Dim.AUTO for k in dyn.get(n, {})} for n in in_names)
            # Wrap.forward takes *args: one (tuple) positional parameter.
            kw["dynamic_shapes"] = (ds,) if isinstance(m, Wrap) else ds
        prog = torch.onnx.export(m, args, dynamo=True, **kw)
        prog.save(path)
    else:
        if dynamic:
            kw["dynamic_axes"] = dyn
        if train:
            kw["training"] = torch.onnx.TrainingMode.TRAINING
            kw["do_constant_folding"] = False
        torch.onnx.export(m, args, path, dynamo=False, **kw)
    return tag, path


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/zoo/models"
    filt = sys.argv[2] if len(sys.argv) > 2 else ""
    os.makedirs(out, exist_ok=True)
    fails = []
    for gen in (tv_models, hf_models):
        for name, make, args, in_names, dyn in gen():
            if filt and filt not in name:
                continue
            combos = [(d, o, dy, False) for d in (False, True) for o in (17, 18) for dy in (False, True)]
            if name in ("resnet18", "mobilenet_v3_small", "bert", "efficientnet_b0"):
                combos.append((False, 17, True, True))
            for dynamo, opset, dynamic, train in combos:
                try:
                    tag, _ = export(name, make, args, in_names, dyn, out, dynamo, opset, dynamic, train)
                    print("ok", tag, flush=True)
                except Exception as e:  # noqa: BLE001 - a failed export is data
                    msg = f"{name} dynamo={dynamo} op{opset} dyn={dynamic} train={train}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    print("FAIL", msg, flush=True)
                    fails.append(msg)
    with open(os.path.join(out, "export_failures.txt"), "w") as f:
        f.write("\n".join(fails) + "\n")


if __name__ == "__main__":
    main()
