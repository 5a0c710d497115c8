"""Export to Llama / yxanul folders, push to the Hugging Face Hub, model card (issue 19).

Submodules: ``args`` (HubArgs, torch-free), ``export`` (`yxanul export`), ``push`` (`yxanul push`,
HubPushCallback), ``card`` (model card), ``loading`` (any run dir / checkpoint / export -> model).
"""
