import eslint from '@eslint/js';
import tseslint from 'typescript-eslint';

// The layering (docs/architecture.md): which @lathe packages each library's sources may import.
// Recipes sit above every library and only apps import them.
const layers = {
  onnx: [],
  runtime: ['onnx'],
  kernels: ['onnx', 'runtime'],
  models: ['onnx', 'runtime'],
  train: ['onnx', 'runtime', 'models', 'kernels'],
  rollout: ['onnx', 'runtime', 'models'],
  grpo: ['onnx', 'runtime', 'models', 'train', 'rollout', 'graders'],
  'reward-models': ['onnx', 'runtime', 'models', 'train'],
  critic: ['onnx', 'runtime', 'models', 'train', 'rollout', 'graders'],
  'policy-extraction': ['onnx', 'runtime', 'models', 'train', 'rollout', 'graders', 'critic'],
  quantization: ['onnx', 'runtime', 'models'],
  distributed: ['onnx', 'runtime', 'kernels'],
  data: [],
  'openai-client': [],
  graders: ['openai-client'],
  tokenizer: [],
  recipes: ['onnx', 'runtime', 'models', 'train', 'rollout', 'grpo', 'graders', 'reward-models', 'quantization', 'data', 'tokenizer', 'openai-client', 'critic', 'policy-extraction', 'kernels', 'distributed'],
};
const layering = Object.entries(layers).map(([pkg, allowed]) => ({
  files: [`packages/${pkg}/src/**/*.ts`],
  rules: {
    'no-restricted-imports': [
      'error',
      {
        paths: Object.keys(layers)
          .filter((other) => other !== pkg && !allowed.includes(other))
          .map((other) => ({ name: `@lathe/${other}`, message: `@lathe/${pkg} sits below @lathe/${other} (eslint.config.mjs, docs/architecture.md): move the code up, or the shared piece down.` })),
      },
    ],
  },
}));

export default tseslint.config(
  { ignores: ['**/dist/**', '**/node_modules/**', '**/.nx/**', '.device/**', '.bundle/**', 'tmp/**', '**/*.js', '**/*.mjs', '**/*.cjs'] },
  eslint.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-constant-condition': ['error', { checkLoops: false }],
    },
  },
  ...layering,
  {
    files: ['**/test/**/*.ts'],
    rules: { '@typescript-eslint/no-non-null-assertion': 'off' },
  },
);
