"""Shared by tests/hub, tests/evaluation and the fault suite: random yxanul models saved like the trainer
saves them, a small prepared dataset (the bundled corpus and tokenizer), a run whose config.yaml points at
that data, and a stand-in for huggingface_hub.HfApi that records what the real client would send."""

import fnmatch
import inspect
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator

from yxanul.checkpoint import save_checkpoint
from yxanul.models import YxanulConfig, YxanulForCausalLM
from yxanul.models.presets import PRESETS

PRESET = "nano"  # the 5M CPU preset: change here only


def random_model(kv_heads: int, tied: bool, vocab: int, seed: int = 0) -> YxanulForCausalLM:
    torch.manual_seed(seed)
    cfg = YxanulConfig(**dict(PRESETS[PRESET], num_key_value_heads=kv_heads), vocab_size=vocab,
                       tie_word_embeddings=tied, backend="torch", max_position_embeddings=64)
    model = YxanulForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm weights: a norm mapped to the wrong place cannot hide
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def fuse_qkv_like_te(model):
    """q/k/v as views of ONE buffer, as TE's LayerNormLinear(parameters_split) registers them."""
    for layer in model.model.layers:
        qkv = layer.self_attention.layernorm_qkv
        parts = [qkv.query_weight, qkv.key_weight, qkv.value_weight]
        buf, start = torch.cat([p.detach() for p in parts]), 0
        for name, p in zip(("query_weight", "key_weight", "value_weight"), parts):
            setattr(qkv, name, torch.nn.Parameter(buf[start:start + p.shape[0]]))
            start += p.shape[0]


def save_run(model, run_dir, te_views: bool = True, step: int = 2, data_dir=None, seq_length: int = 64):
    """A real checkpoint through accelerate (the trainer's save_checkpoint), the config.yaml of the run."""
    if te_views:
        fuse_qkv_like_te(model)
    acc = Accelerator(cpu=True)
    prepared = acc.prepare(model)
    flat = {"model": PRESET, "seq_length": seq_length, "tie_word_embeddings": model.config.tie_word_embeddings,
            "data_dir": str(data_dir or run_dir / "no-data")}
    n_layers = model.config.num_hidden_layers
    save_checkpoint(acc, run_dir, {"step": step, "tokens_seen": 100 * step, "val_loss": 5.0, "precision": "FP32",
                                   "backend": "te" if te_views else "torch", "data": {"epoch": 0, "position": 0}},
                    keep_last=3, config_yaml=yaml.safe_dump(flat),
                    extra=(lambda d: add_te_fp8_state(Path(d), n_layers)) if te_views else None)  # before the manifest
    return prepared


def add_te_fp8_state(ckpt, n_layers: int) -> None:
    """What a TE FP8 checkpoint holds besides the weights: ``*_extra_state`` tensors (TE's serialized
    scaling state, also under modules the torch twin lacks) and yxanul's fp8_state.safetensors."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(ckpt / "model.safetensors"))
    for i in range(n_layers):
        for mod in ("self_attention.layernorm_qkv", "self_attention.proj", "self_attention.core_attention",
                    "layernorm_mlp"):
            state[f"model.layers.{i}.{mod}._extra_state"] = torch.randint(0, 255, (64,), dtype=torch.uint8)
    save_file(state, str(ckpt / "model.safetensors"))
    save_file({"scale": torch.ones(4)}, str(ckpt / "fp8_state.safetensors"))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    from yxanul.data.args import DataArgs
    from yxanul.data.prepare import prepare

    d = tmp_path_factory.mktemp("data") / "d"
    return prepare(DataArgs(data_dir=str(d), max_documents=40, val_fraction=0.2), progress=False,
                   say=lambda *a, **k: None)


@pytest.fixture
def tok_run(tmp_path, prepared):
    """(run dir, its model): a tiny 8192-vocabulary model checkpointed with data_dir = the prepared folder."""
    model = random_model(2, False, 8192, seed=5)
    run = tmp_path / "run"
    save_run(model, run, te_views=False, data_dir=prepared)
    return run, model


SECRET = "hf_SeCrEtToKeN1234567890abcdef"


def real_signature_accepts(method: str, **kwargs) -> None:
    """The real HfApi method takes exactly these keywords (guards the stand-in against API drift)."""
    from huggingface_hub import HfApi

    inspect.signature(getattr(HfApi, method)).bind(None, **kwargs)


def no_token(mp: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Hugging Face token anywhere huggingface_hub looks (the environment, the login file, OIDC), and the Hub
    not switched off (the suite runs with HF_HUB_OFFLINE=1, which is refused first)."""
    mp.setenv("HF_HUB_OFFLINE", "0")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        mp.delenv(name, raising=False)
    mp.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-login" / "token"))


class RecordingHfApi:
    """Stand-in for huggingface_hub.HfApi: same method names and keywords (checked against the real
    signatures); records calls and the folder's files at upload time. ``fail`` uploads raise first (a flaky
    network); ``delay`` makes uploads slow. ``refuse``: create_repo answers with that HTTP status, as the Hub
    does for a token that may not write there (the real client's error type); ``create_gate``: create_repo
    waits for it (a Hub that does not answer); ``create_fail``: create_repo raises ConnectionError."""

    def __init__(self, fail: int = 0, delay: float = 0.0, gate: threading.Event | None = None,
                 refuse: int | None = None, create_gate: threading.Event | None = None, create_fail: bool = False):
        self.calls, self.fail, self.delay, self.gate = [], fail, delay, gate
        self.refuse, self.create_gate, self.create_fail = refuse, create_gate, create_fail
        self.active, self.max_active = 0, 0
        self.repos = {}  # (repo_id, revision) -> {path: bytes}: what the Hub holds after each commit
        self.lock = threading.Lock()

    def create_repo(self, repo_id, *, repo_type=None, private=False, exist_ok=False, **kw):
        assert "token" not in kw
        real_signature_accepts("create_repo", repo_id=repo_id, repo_type=repo_type, private=private,
                               exist_ok=exist_ok, **kw)
        if self.create_gate is not None:
            assert self.create_gate.wait(timeout=120)
        if self.create_fail:
            raise ConnectionError("Hub unreachable")
        if self.refuse:
            import httpx2  # huggingface_hub's own HTTP client, for its real error type
            from huggingface_hub.errors import HfHubHTTPError

            request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
            raise HfHubHTTPError(f"{self.refuse} Client Error: You don't have the rights to create a model under "
                                 f"the namespace \"{repo_id.split('/')[0]}\"",
                                 response=httpx2.Response(self.refuse, request=request))
        self.calls.append(("create_repo", dict(repo_id=repo_id, private=private, exist_ok=exist_ok)))
        return f"https://huggingface.co/{repo_id}"

    def create_branch(self, repo_id, *, branch, repo_type=None, exist_ok=False, **kw):
        assert "token" not in kw
        real_signature_accepts("create_branch", repo_id=repo_id, branch=branch, repo_type=repo_type,
                               exist_ok=exist_ok, **kw)
        self.calls.append(("create_branch", dict(repo_id=repo_id, branch=branch)))

    def upload_folder(self, *, repo_id, folder_path, commit_message, revision=None, repo_type=None, **kw):
        assert "token" not in kw
        real_signature_accepts("upload_folder", repo_id=repo_id, folder_path=folder_path, revision=revision,
                               commit_message=commit_message, repo_type=repo_type, **kw)
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.delay)
            if self.gate is not None:  # a slow network: uploads wait until the test opens the gate
                assert self.gate.wait(timeout=120)
            if self.fail:
                self.fail -= 1
                raise ConnectionError("Hub unreachable")
            files = {str(p.relative_to(folder_path)): p.read_bytes() for p in Path(folder_path).rglob("*")
                     if p.is_file()}
            self.calls.append(("upload_folder", dict(repo_id=repo_id, files=files, message=commit_message,
                                                     revision=revision)))
            # the Hub's commit: remote files matching delete_patterns go, unless this commit uploads them again
            repo = self.repos.setdefault((repo_id, revision), {})
            for path in [p for p in repo if p not in files]:
                if any(fnmatch.fnmatch(path, pat) for pat in kw.get("delete_patterns") or []):
                    del repo[path]
            repo.update(files)
            return f"https://huggingface.co/{repo_id}/commit/{len(self.calls)}"
        finally:
            with self.lock:
                self.active -= 1

    def uploads(self):
        return [c for name, c in self.calls if name == "upload_folder"]
