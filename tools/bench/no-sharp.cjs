// Stands in for the `sharp` image library in bundles that carry @huggingface/transformers for its
// tokenizers only: transformers requires sharp when it loads, but only image processing calls it,
// and sharp's native binary cannot travel to the GPU machine (no registry there).
module.exports = {};
