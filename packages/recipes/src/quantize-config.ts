/** `lathe quantize` and `lathe quantize eval`'s options: defaults, flags and YAML keys. */
import { deviceOption, promptFormatOptions, tokenizerOption } from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** Every option of `lathe quantize`. */
export const quantizeSchema = {
  model: { type: 'string', default: '', describe: 'Hugging Face model folder to quantize: a causal LM or a reward model (…ForSequenceClassification) [required]' },
  format: {
    type: 'string',
    default: 'nf4',
    choices: ['int8', 'int4', 'nf4'],
    describe: "int8: per output channel, symmetric (bitsandbytes' LLM.int8 layout); int4: per block of K with a float32 scale (ONNX Runtime's MatMulNBits layout); nf4: 4-bit NormalFloat in blocks of 64 (bitsandbytes' layout)",
  },
  block_size: { type: 'number', default: 64, integer: true, min: 1, describe: 'int4: 32, 64 or 128 weights per scale (a K that does not divide it is padded with zero weights, and the layer named); nf4: 64; not read for int8' },
  zero_points: { type: 'boolean', default: false, describe: 'int4: a 4-bit zero point per block (asymmetric, min–max); default symmetric' },
  double_quant: { type: 'boolean', default: false, describe: "nf4: quantize the block scales too (mean-subtracted, 8-bit dynamic code in blocks of 256: about 0.37 bit per weight less), as bitsandbytes' bnb_4bit_use_double_quant" },
  lm_head: {
    type: 'string',
    default: 'none',
    choices: ['none', 'int8', 'int4', 'nf4'],
    describe: "Also quantize the LM head (the embedding, when tied) for generation's logits: an extra copy in this format (int4 with --block_size), re-made from the dense head on load; the dense head stays for the embedding lookup and scoring",
  },
  skip: { type: 'string', default: '', describe: 'Comma-separated parts of weight names to leave dense (e.g. mlp.down_proj); every decoder projection (q/k/v/o, gate/up/down) is quantized otherwise; embeddings, norms and the LM or score head stay dense' },
  out: { type: 'string', default: '', describe: 'Folder to write the quantized checkpoint to (config.json with quantization_config, model.safetensors, the tokenizer files) [required]' },
  overwrite: { type: 'boolean', default: false, describe: 'Write into a folder that already holds a model' },
} as const satisfies OptionSchema;

/** A resolved `lathe quantize` config. */
export type QuantizeConfig = ConfigOf<typeof quantizeSchema>;

/** Every option of `lathe quantize eval`. */
export const quantizeEvalSchema = {
  model: { type: 'string', default: '', describe: 'The original model folder [required]' },
  quantized: { type: 'string', default: '', describe: 'The quantized checkpoint of it (`lathe quantize --out`) [required]' },
  tokenizer: tokenizerOption,
  data: {
    type: 'string',
    default: '',
    describe: 'A causal LM: a JSONL file of {"prompt"} rows, which the original continues greedily (rows with an "answer" are also graded: both models\' greedy answers by the math grader); a reward model: preference pairs as `lathe rm eval` reads them [required]',
  },
  ...promptFormatOptions,
  limit: { type: 'number', default: 32, integer: true, min: 0, describe: 'Only the first N prompts or pairs (0: all)' },
  max_new_tokens: { type: 'number', default: 64, integer: true, min: 1, describe: "A causal LM: tokens the original generates per prompt (greedy); KL and perplexity are measured on them" },
  max_length: { type: 'number', default: 1024, integer: true, min: 2, describe: 'A reward model: longest pair sequence in tokens (longer pairs are skipped and counted)' },
  batch_size: { type: 'number', default: 8, integer: true, min: 1, describe: 'Sequences (prompts, or pairs) per run' },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'float32', choices: ['float32', 'bfloat16'], describe: 'Dtype of the weights and compute of both models (bfloat16 needs --device cuda); KL and log-probs are float32 either way' },
  kernels: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'kernel', 'dequantize'],
    describe: "How the quantized model's layers run: ONNX Runtime's MatMulNBits/MatMulBnb4 kernels, or dequantize + MatMul (standard ops); auto: the kernels (a reward model is scored dequantized)",
  },
} as const satisfies OptionSchema;

/** A resolved `lathe quantize eval` config. */
export type QuantizeEvalConfig = ConfigOf<typeof quantizeEvalSchema>;
