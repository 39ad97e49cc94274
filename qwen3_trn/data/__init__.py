"""Training text: the corpus and tokenizer the package ships (``embedded``) and the sources a
run can read (``sources``: embedded, local files, a hub dataset, C4), registered with
torchtitan's dataset table."""
