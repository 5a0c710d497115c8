"""Export to Llama / yxanul folders, push to the Hugging Face Hub, model card.

Submodules: ``args`` (HubArgs, torch-free), ``export`` (`yxanul export`), ``push`` (`yxanul push`,
HubPushCallback), ``card`` (model card), ``loading`` (any run dir / checkpoint / export -> model).
"""
