"""transformers' architectures in the corpus: text encoders, vision transformers and CNNs, speech
encoders, CLIP, seq2seq models (encoder and one decoder step) and causal decoders without cache.

Each entry is its family's published configuration shrunk (2 layers, a small hidden size and
vocabulary), built with transformers' own model class and seeded random weights (the 1-D ones,
norms and biases, perturbed so they matter, as :mod:`.llm_families` does), wrapped in a module
that returns the main tensors (logits, last hidden state) so it exports as a user would.

transformers is imported only when an entry is made, after
:mod:`edgebuild_testplugin.torchvision_models` (transformers imports torchvision when it is
installed, and torchvision's C ops must exist by then).
"""

from __future__ import annotations

from .corpus import Entry, Made
from .llm_families import CONFIGS as LLM_CONFIGS

TOKENS = 16  # sequence length of every token input
VOCAB = 512


def _transformers():
    from .torchvision_models import torchvision  # noqa: F401 (defines torchvision's ops before transformers looks)
    import transformers

    return transformers


def _outputs_module(model, outputs: tuple[str, ...], input_names: tuple[str, ...]):
    """``model`` called with keyword inputs, returning the named fields of its output, in order."""
    import torch

    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            options = {"output_hidden_states": True} if "hidden_states[-1]" in outputs else {}
            found = self.model(**dict(zip(input_names, tensors)), return_dict=True, **options)
            return tuple(found.hidden_states[-1] if key == "hidden_states[-1]" else getattr(found, key)
                         for key in outputs)

    return Outputs()


def _model(config: dict, model_class: str, part: str | None = None):
    """``model_class`` from ``config`` (a ``model_type`` and its fields) with seeded random weights."""
    import torch

    transformers = _transformers()
    data = dict(config)
    made_config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    cls = getattr(transformers, model_class)
    model = cls.from_config(made_config) if model_class.startswith("Auto") else cls(made_config)
    with torch.no_grad():  # the default init leaves norms at 1 and biases at 0: perturb so they matter
        for parameter in model.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model = model.eval()
    return getattr(model, part) if part else model


REAL_TOKENS = 12  # validation samples: 12 real tokens, then padding the attention mask hides


def _tokens(vocab: int, pad: int = 0, seed: int = 0, real: int = REAL_TOKENS) -> dict:
    """The recipe's tokens source: ``real`` random ids, then ``pad``."""
    return {"tokens": {"vocab_size": vocab, "pad": pad, "seed": seed, "real_tokens": real}}


def _mask() -> dict:
    """The attention mask of :func:`_tokens`' samples: ones on the real tokens, zeros on the padding."""
    return {"value": [[1] * REAL_TOKENS + [0] * (TOKENS - REAL_TOKENS)]}


def _text(config: dict, model_class: str, outputs: tuple[str, ...], mask: bool = True, pad: int = 0,
          decoder_tokens: int = 0, decoder_start: int = 0):
    """A model on ``input_ids`` [1, TOKENS] (and ``attention_mask``; ``decoder_input_ids`` [1, n])."""

    def make() -> Made:
        import torch

        model = _model(config, model_class)
        vocab = model.config.vocab_size
        names = ("input_ids",) + (("attention_mask",) if mask else ())
        tensors = [torch.randint(3, vocab, (1, TOKENS))] + ([torch.ones(1, TOKENS, dtype=torch.int64)] if mask else [])
        sources = {"input_ids": _tokens(vocab, pad), "attention_mask": _mask()}
        if decoder_tokens:
            names += ("decoder_input_ids",)
            tensors.append(torch.full((1, decoder_tokens), decoder_start, dtype=torch.int64))
            sources["decoder_input_ids"] = _tokens(vocab, pad, seed=1, real=decoder_tokens)
        return Made(_outputs_module(model, outputs, names), tuple(tensors), names,
                    {name: source for name, source in sources.items() if name in names})

    return make


def _signal(config: dict, model_class: str, input_name: str, shape: tuple[int, ...], outputs: tuple[str, ...],
            part: str | None = None, low: float = -1.0, high: float = 1.0):
    """A model on one float input (pixels, waveform, mel features) drawn uniform in [low, high)."""

    def make() -> Made:
        import torch

        model = _model(config, model_class, part)
        example = low + (high - low) * torch.rand(*shape)
        source = {"random": {"low": low, "high": high, "seed": 0}}
        return Made(_outputs_module(model, outputs, (input_name,)), (example,), (input_name,), {input_name: source})

    return make


def _text_image(config: dict, model_class: str):
    """A text-image model (CLIP, SigLIP) on token ids, their mask and an image."""

    def make() -> Made:
        import torch

        model = _model(config, model_class)
        names = ("input_ids", "attention_mask", "pixel_values")
        size = config["vision_config"]["image_size"]
        tensors = (torch.randint(3, VOCAB, (1, TOKENS)), torch.ones(1, TOKENS, dtype=torch.int64),
                   torch.rand(1, 3, size, size) * 2 - 1)
        sources = {"input_ids": _tokens(VOCAB), "attention_mask": _mask(),
                   "pixel_values": {"random": {"low": -1.0, "high": 1.0, "seed": 0}}}
        return Made(_outputs_module(model, ("logits_per_image", "text_embeds", "image_embeds"), names), tensors, names,
                    sources)

    return make


# -- published configurations, shrunk ------------------------------------------------------------

_BERT_LIKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "vocab_size": VOCAB, "max_position_embeddings": 64, "num_labels": 3}
_ROBERTA_LIKE = {**_BERT_LIKE, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "type_vocab_size": 1,
                 "max_position_embeddings": 66}  # positions start after the padding id
ENCODERS = {
    "bert": {"model_type": "bert", **_BERT_LIKE},
    "distilbert": {"model_type": "distilbert", "dim": 64, "hidden_dim": 128, "n_layers": 2, "n_heads": 4,
                   "vocab_size": VOCAB, "max_position_embeddings": 64, "num_labels": 3},
    "roberta": {"model_type": "roberta", **_ROBERTA_LIKE},
    "albert": {"model_type": "albert", **_BERT_LIKE, "embedding_size": 32, "hidden_act": "gelu_new"},
    "electra": {"model_type": "electra", **_BERT_LIKE, "embedding_size": 32},
    # DeBERTa-v3: relative attention with log buckets, shared keys, no absolute positions
    "deberta_v2": {"model_type": "deberta-v2", **_BERT_LIKE, "relative_attention": True, "position_buckets": 32,
                   "max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"], "norm_rel_ebd": "layer_norm",
                   "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0},
    "xlm_roberta": {"model_type": "xlm-roberta", **_ROBERTA_LIKE},
    "mpnet": {"model_type": "mpnet", **_BERT_LIKE, "pad_token_id": 1, "max_position_embeddings": 66,
              "relative_attention_num_buckets": 32},
    # Funnel: the sequence pooled between blocks, relative attention
    "funnel": {"model_type": "funnel", "block_sizes": [1, 1], "num_decoder_layers": 1, "d_model": 64, "n_head": 4,
               "d_head": 16, "d_inner": 128, "vocab_size": VOCAB, "num_labels": 3},
    # SqueezeBERT: grouped 1-D convolutions in place of the dense layers
    "squeezebert": {"model_type": "squeezebert", **_BERT_LIKE, "embedding_size": 64, "q_groups": 4, "k_groups": 4,
                    "v_groups": 4, "post_attention_groups": 1, "intermediate_groups": 4, "output_groups": 4},
    # ConvBERT: span-based dynamic convolution heads beside self-attention
    "convbert": {"model_type": "convbert", **_BERT_LIKE, "embedding_size": 64, "head_ratio": 2,
                 "conv_kernel_size": 9, "num_groups": 1},
    # RoFormer: rotary positions in an encoder
    "roformer": {"model_type": "roformer", **_BERT_LIKE, "embedding_size": 64},
}
# other heads on the same encoders: question answering, token classification, masked LM (tied embeddings)
HEADS = {
    "bert_question_answering": ({**ENCODERS["bert"], "num_labels": 2}, "BertForQuestionAnswering",
                                ("start_logits", "end_logits")),
    "bert_token_classification": (ENCODERS["bert"], "BertForTokenClassification", ("logits",)),
    "roberta_masked_lm": (ENCODERS["roberta"], "RobertaForMaskedLM", ("logits",)),
}

_VIT_LIKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "image_size": 32, "patch_size": 8, "num_labels": 10}
VISION = {
    "vit": ({"model_type": "vit", **_VIT_LIKE}, "ViTForImageClassification", 32, ("logits",)),
    "deit": ({"model_type": "deit", **_VIT_LIKE}, "DeiTForImageClassificationWithTeacher", 32, ("logits",)),
    # BEiT-base: relative position bias per layer, layer scale, mean pooling
    "beit": ({"model_type": "beit", **_VIT_LIKE, "use_relative_position_bias": True, "use_mean_pooling": True,
              "layer_scale_init_value": 0.1, "vocab_size": 64}, "BeitForImageClassification", 32, ("logits",)),
    "swin": ({"model_type": "swin", "image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
              "num_heads": [2, 4], "window_size": 4, "num_labels": 10}, "SwinForImageClassification", 32, ("logits",)),
    "convnext": ({"model_type": "convnext", "num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1],
                  "image_size": 32, "num_labels": 10}, "ConvNextForImageClassification", 32, ("logits",)),
    # ResNet-50: bottleneck blocks
    "resnet": ({"model_type": "resnet", "embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1],
                "layer_type": "bottleneck", "num_labels": 10}, "ResNetForImageClassification", 32, ("logits",)),
    "mobilevit": ({"model_type": "mobilevit", "image_size": 64, "hidden_sizes": [32, 48, 64],
                   "neck_hidden_sizes": [8, 16, 24, 24, 32, 40, 80], "num_attention_heads": 2, "num_labels": 10},
                  "MobileViTForImageClassification", 64, ("logits",)),
    # SegFormer-b0's layout, two of its four stages
    "segformer": ({"model_type": "segformer", "num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1],
                   "hidden_sizes": [16, 32], "patch_sizes": [7, 3], "strides": [4, 2], "num_attention_heads": [1, 2],
                   "mlp_ratios": [4, 4], "decoder_hidden_size": 32, "num_labels": 5},
                  "SegformerForSemanticSegmentation", 64, ("logits",)),
    # DINOv2: its position embeddings interpolated (bicubic) to the image's patch grid
    "dinov2": ({"model_type": "dinov2", **_VIT_LIKE, "image_size": 56, "patch_size": 14, "layerscale_value": 0.5},
               "Dinov2Model", 56, ("last_hidden_state", "pooler_output")),
    "swinv2": ({"model_type": "swinv2", "image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
                "num_heads": [2, 4], "window_size": 4, "num_labels": 10}, "Swinv2ForImageClassification", 32,
               ("logits",)),
    # LeViT: attention with subsampling between stages, batch-normed linears
    "levit": ({"model_type": "levit", "image_size": 64, "hidden_sizes": [32, 48], "num_attention_heads": [2, 3],
               "depths": [1, 1], "key_dim": [8, 8], "mlp_ratio": [2, 2], "attention_ratio": [2, 2],
               "down_ops": [["Subsample", 8, 4, 4, 2, 2]], "num_labels": 10}, "LevitForImageClassification", 64,
              ("logits",)),
    "poolformer": ({"model_type": "poolformer", "num_encoder_blocks": 2, "depths": [1, 1], "hidden_sizes": [16, 32],
                    "patch_sizes": [7, 3], "strides": [4, 2], "padding": [2, 1], "num_labels": 10},
                   "PoolFormerForImageClassification", 32, ("logits",)),
    # EfficientNet-B0's first two stages: depthwise convs, squeeze-excitation
    "efficientnet": ({"model_type": "efficientnet", "image_size": 32, "width_coefficient": 1.0,
                      "depth_coefficient": 1.0, "kernel_sizes": [3, 5], "in_channels": [32, 16],
                      "out_channels": [16, 24], "depthwise_padding": [], "strides": [1, 2],
                      "num_block_repeats": [1, 1], "expand_ratios": [1, 6], "hidden_dim": 1280, "num_labels": 10},
                     "EfficientNetForImageClassification", 32, ("logits",)),
    # CvT: convolutional token embeddings and depthwise-conv projections of q, k, v
    "cvt": ({"model_type": "cvt", "patch_sizes": [7, 3], "patch_stride": [4, 2], "patch_padding": [2, 1],
             "embed_dim": [16, 32], "num_heads": [1, 2], "depth": [1, 2],  # CvtStage indexes its drop path rates by stage "mlp_ratio": [4.0, 4.0],
             "attention_drop_rate": [0.0, 0.0], "drop_rate": [0.0, 0.0], "drop_path_rate": [0.0, 0.0],
             "qkv_bias": [True, True], "cls_token": [False, True], "qkv_projection_method": ["dw_bn", "dw_bn"],
             "kernel_qkv": [3, 3], "padding_kv": [1, 1], "stride_kv": [2, 2], "padding_q": [1, 1],
             "stride_q": [1, 1], "num_labels": 10}, "CvtForImageClassification", 32, ("logits",)),
    # FocalNet: focal modulation (gated depthwise convs at growing windows) in place of attention
    "focalnet": ({"model_type": "focalnet", "image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
                  "focal_levels": [2, 2], "focal_windows": [3, 3], "num_labels": 10},
                 "FocalNetForImageClassification", 32, ("logits",)),
    "mobilenet_v2": ({"model_type": "mobilenet_v2", "image_size": 32, "depth_multiplier": 0.35, "num_labels": 10},
                     "MobileNetV2ForImageClassification", 32, ("logits",)),
}

_WAV2VEC2_LIKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "conv_dim": [32, 32], "conv_stride": [5, 2], "conv_kernel": [10, 3], "num_conv_pos_embeddings": 16,
                  "num_conv_pos_embedding_groups": 4, "feat_extract_norm": "group", "vocab_size": 32}
SPEECH = {
    "wav2vec2": ({"model_type": "wav2vec2", **_WAV2VEC2_LIKE}, "Wav2Vec2Model"),
    "hubert": ({"model_type": "hubert", **_WAV2VEC2_LIKE}, "HubertModel"),
    # WavLM: gated relative position bias (log buckets)
    "wavlm": ({"model_type": "wavlm", **_WAV2VEC2_LIKE, "num_buckets": 32, "max_bucket_distance": 64}, "WavLMModel"),
    # SEW-D: squeezed sequence, DeBERTa-style disentangled attention
    "sew_d": ({"model_type": "sew-d", **_WAV2VEC2_LIKE, "squeeze_factor": 2, "max_position_embeddings": 64,
               "position_buckets": 32, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
               "norm_rel_ebd": "layer_norm", "share_att_key": True}, "SEWDModel"),
}
WHISPER = {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
           "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
           "num_mel_bins": 16, "max_source_positions": 16, "max_target_positions": 32, "vocab_size": VOCAB,
           "pad_token_id": VOCAB - 2, "bos_token_id": VOCAB - 2, "eos_token_id": VOCAB - 2,
           "decoder_start_token_id": VOCAB - 1}

# speech models on features (mel frames): Whisper's encoder, Speech2Text's encoder, AST
SPEECH2TEXT = {"model_type": "speech_to_text", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
               "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
               "decoder_ffn_dim": 128, "vocab_size": VOCAB, "input_feat_per_channel": 16, "num_conv_layers": 2,
               "conv_kernel_sizes": [5, 5], "conv_channels": 64, "max_source_positions": 64}
AST = {"model_type": "audio-spectrogram-transformer", **_VIT_LIKE, "patch_size": 16, "frequency_stride": 10,
       "time_stride": 10, "max_length": 64, "num_mel_bins": 32}
FEATURES = {
    "whisper_encoder": (WHISPER, "WhisperModel", "input_features",
                        (1, WHISPER["num_mel_bins"], 2 * WHISPER["max_source_positions"]), ("last_hidden_state",),
                        "encoder"),
    "speech_to_text_encoder": (SPEECH2TEXT, "Speech2TextModel", "input_features", (1, 32, 16),
                               ("last_hidden_state",), "encoder"),
    "audio_spectrogram_transformer": (AST, "ASTForAudioClassification", "input_values", (1, 64, 32), ("logits",),
                                      None),
}

CLIP = {"model_type": "clip", "projection_dim": 32,
        "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "vocab_size": VOCAB, "max_position_embeddings": TOKENS, "eos_token_id": 2},
        "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "image_size": 32, "patch_size": 8}}
SIGLIP = {"model_type": "siglip",
          "text_config": {**CLIP["text_config"], "pad_token_id": 1, "eos_token_id": 2},
          "vision_config": CLIP["vision_config"]}

_SEQ2SEQ_LIKE = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
                 "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": VOCAB,
                 "max_position_embeddings": 64}
SEQ2SEQ = {
    # t5-small's layout: relative position buckets (log), ReLU feed-forward
    "t5": ({"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2,
            "num_heads": 4, "vocab_size": VOCAB, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "decoder_start_token_id": 0},
           "T5ForConditionalGeneration", 0, 0),
    "bart": ({"model_type": "bart", **_SEQ2SEQ_LIKE, "pad_token_id": 1, "decoder_start_token_id": 2},
             "BartForConditionalGeneration", 1, 2),
    # Marian (opus-mt): sinusoidal positions, scaled embeddings, the last id pads and starts decoding
    "marian": ({"model_type": "marian", **_SEQ2SEQ_LIKE, "pad_token_id": VOCAB - 1,
                "decoder_start_token_id": VOCAB - 1, "eos_token_id": 0, "scale_embedding": True},
               "MarianMTModel", VOCAB - 1, VOCAB - 1),
    "mbart": ({"model_type": "mbart", **_SEQ2SEQ_LIKE, "pad_token_id": 1, "decoder_start_token_id": 2},
              "MBartForConditionalGeneration", 1, 2),
    # Pegasus: sinusoidal positions, pre-norm
    "pegasus": ({"model_type": "pegasus", **_SEQ2SEQ_LIKE, "pad_token_id": 0, "eos_token_id": 1,
                 "decoder_start_token_id": 0}, "PegasusForConditionalGeneration", 0, 0),
}

_DECODER_LIKE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "vocab_size": VOCAB, "max_position_embeddings": 256, "use_cache": False}
DECODERS = {
    **{family: {**config, "use_cache": False} for family, config in LLM_CONFIGS.items()},
    "mistral": {"model_type": "mistral", **_DECODER_LIKE, "num_key_value_heads": 2, "sliding_window": 4096,
                "rms_norm_eps": 1e-5},
    # Pythia: partial rotary, parallel residual
    "gpt_neox": {"model_type": "gpt_neox", **_DECODER_LIKE, "rotary_pct": 0.25, "use_parallel_residual": True},
    # OPT: learned positions from the mask's cumulative sum
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "word_embed_proj_dim": 64, "vocab_size": VOCAB,
            "max_position_embeddings": 256, "use_cache": False},
    # BLOOM: ALiBi
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB,
              "use_cache": False},
    # Gemma-2b: multi-query attention, head 16, tanh GELU
    "gemma": {"model_type": "gemma", **_DECODER_LIKE, "num_key_value_heads": 1, "head_dim": 16,
              "hidden_activation": "gelu_pytorch_tanh"},
    # Falcon-7b: multi-query, parallel attention, rotary
    "falcon": {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "vocab_size": VOCAB, "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True,
               "alibi": False, "bias": False, "use_cache": False},
    # Mixtral: sparse mixture of experts (top-2 of 4 routed per token)
    "mixtral": {"model_type": "mixtral", **_DECODER_LIKE, "num_key_value_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": None},
    # GPT-J: interleaved rotary on part of the head, parallel attention and MLP
    "gptj": {"model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "vocab_size": VOCAB,
             "n_positions": 256, "use_cache": False},
    # MPT: ALiBi, no biases
    "mpt": {"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 2,
            "max_seq_len": 256, "vocab_size": VOCAB, "use_cache": False},
    # Phi-2: partial rotary, parallel blocks, dense biases
    "phi": {"model_type": "phi", **_DECODER_LIKE, "partial_rotary_factor": 0.5},
    # Qwen3: RMSNorm on queries and keys
    "qwen3": {"model_type": "qwen3", **_DECODER_LIKE, "num_key_value_heads": 2, "head_dim": 16},
    # Mamba: selective state space (its sequential scan, no CUDA kernels), causal depthwise conv
    "mamba": {"model_type": "mamba", "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2, "expand": 2,
              "conv_kernel": 4, "vocab_size": VOCAB, "use_cache": False},
}

# one cheap entry of every family (its fp32 case), picked by build time in the corpus table
CI = {"bert", "poolformer", "hubert", "siglip", "marian", "llama"}

ENTRIES = [
    *(Entry("text-encoder", name, _text(config, "AutoModelForSequenceClassification", ("logits", "hidden_states[-1]"),
                                        pad=config.get("pad_token_id", 0)), ci=name in CI)
      for name, config in ENCODERS.items()),
    *(Entry("vision", name, _signal(config, model_class, "pixel_values", (1, config.get("num_channels", 3), size, size),
                                    outputs), ci=name in CI)
      for name, (config, model_class, size, outputs) in VISION.items()),
    *(Entry("speech", name, _signal(config, model_class, "input_values", (1, 800), ("last_hidden_state",),
                                    low=-3.0, high=3.0), ci=name in CI)
      for name, (config, model_class) in SPEECH.items()),
    *(Entry("speech", name, _signal(config, model_class, input_name, shape, outputs, part=part), ci=name in CI)
      for name, (config, model_class, input_name, shape, outputs, part) in FEATURES.items()),
    *(Entry("text-encoder", name, _text(config, model_class, outputs, pad=config.get("pad_token_id", 0)))
      for name, (config, model_class, outputs) in HEADS.items()),
    Entry("clip", "clip", _text_image(CLIP, "CLIPModel"), ci="clip" in CI),
    Entry("clip", "siglip", _text_image(SIGLIP, "SiglipModel"), ci="siglip" in CI),
    *(Entry("seq2seq", name, _text(config, model_class, ("logits", "encoder_last_hidden_state"), pad=pad,
                                   decoder_tokens=1, decoder_start=start), ci=name in CI)
      for name, (config, model_class, pad, start) in SEQ2SEQ.items()),
    *(Entry("decoder", name, _text(config, "AutoModelForCausalLM", ("logits",)), ci=name in CI)
      for name, config in DECODERS.items()),
]

__all__ = ["ENTRIES"]
