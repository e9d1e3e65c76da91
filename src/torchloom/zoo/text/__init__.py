"""Text components: tokenizer, vocabularies and indexers, one-hot / bag-of-words encoders, a
word decoder, word embeddings (trainable or initialised from GloVe / word2vec files) and a
pretrained sentence encoder (sentence-transformers)."""
