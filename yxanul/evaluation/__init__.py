"""`yxanul eval`: validation loss/perplexity on prepared shards and multiple-choice tasks in HellaSwag's
format (``tasks``), the bundled Shakespeare cloze task, and the in-training ``EvalTasksCallback``."""
