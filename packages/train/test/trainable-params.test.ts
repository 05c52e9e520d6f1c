/** What full fine-tuning trains: every weight, with weight decay on matrices and embeddings only. */
import { parseConfig } from '@lathe/models';
import { fullTrainableParams } from '@lathe/train';

test('fullTrainableParams: every weight of a Qwen2 layer (biases included), decay on the embedding and matrices, none on norms and biases', () => {
  const config = parseConfig({ architectures: ['Qwen2ForCausalLM'], vocab_size: 10, hidden_size: 8, intermediate_size: 12, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 4, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 16, tie_word_embeddings: false });
  const a = 'model.layers.0.self_attn';
  const m = 'model.layers.0.mlp';
  expect(fullTrainableParams(config)).toEqual([
    { name: 'model.embed_tokens.weight', shape: [10, 8], decay: true },
    { name: 'model.layers.0.input_layernorm.weight', shape: [8], decay: false },
    { name: `${a}.q_proj.weight`, shape: [8, 8], decay: true },
    { name: `${a}.k_proj.weight`, shape: [4, 8], decay: true },
    { name: `${a}.v_proj.weight`, shape: [4, 8], decay: true },
    { name: `${a}.q_proj.bias`, shape: [8], decay: false },
    { name: `${a}.k_proj.bias`, shape: [4], decay: false },
    { name: `${a}.v_proj.bias`, shape: [4], decay: false },
    { name: `${a}.o_proj.weight`, shape: [8, 8], decay: true },
    { name: 'model.layers.0.post_attention_layernorm.weight', shape: [8], decay: false },
    { name: `${m}.gate_proj.weight`, shape: [12, 8], decay: true },
    { name: `${m}.up_proj.weight`, shape: [12, 8], decay: true },
    { name: `${m}.down_proj.weight`, shape: [8, 12], decay: true },
    { name: 'model.norm.weight', shape: [8], decay: false },
    { name: 'lm_head.weight', shape: [10, 8], decay: true },
  ]);
});
