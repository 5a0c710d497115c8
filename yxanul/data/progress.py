"""`yxanul prepare`'s progress bar (tqdm: tokens, tokens/s, ETA) and its closing report."""

from __future__ import annotations


def progress_bar(packer, args, enabled: bool):
    """tqdm over tokens (train + val, EOS included: what ``bar.update`` is given per document), so its
    rate is tokens/s and its ETA (total - n) / rate: ``total`` is ``max_tokens`` when set, else, for one
    source of known length, the tokens so far scaled by documents to read / documents read (updated at
    every document); a resumed run starts at the tokens already written (``initial``), which tqdm leaves
    out of the rate."""
    from tqdm.auto import tqdm

    rows = [getattr(s, "num_rows", None) for s in packer.streams]
    total = args.max_tokens
    bar = tqdm(desc="tokenizing", unit="tok", unit_scale=True, total=total, initial=packer.tokens0,
               disable=not enabled, mininterval=1.0, smoothing=0.1)
    if total is None and len(rows) == 1 and rows[0]:  # estimate the total from the share of documents read
        docs = rows[0] * packer.mix.max_epochs[0]
        docs = docs if args.max_documents is None else min(docs, args.max_documents)
        update = bar.update

        def estimating(n):
            done = max(packer.doc_index, 1)
            bar.total = max(int(bar.n * docs / done), bar.n)
            update(n)
        bar.update = estimating
    return bar


def report(say, out, splits: dict, packer, dt: float) -> None:
    """The closing lines: splits, per-source shares, what ended a mixture, tokens/s (per core)."""
    tr, va = splits["train"], splits["val"]
    new = tr["tokens"] + va["tokens"] - packer.tokens0
    procs = packer.pool.processes
    say(f"data: {packer.doc_index:,} documents -> train {tr['tokens']:,} tokens ({tr['documents']:,} docs, "
        f"{len(tr['shards'])} shards) / val {va['tokens']:,} tokens ({va['documents']:,} docs), "
        f"{packer.pool.encoder.dtype} -> {out}")
    if len(packer.names) > 1 or packer.mix.max_epochs[0] > 1:
        for name, r in packer.mix.report().items():
            say(f"data:   {name}: {r['tokens']:,} tokens ({100 * r['token_share']:.2f} % of tokens, "
                f"{100 * r['document_share']:.2f} % of documents; weight {100 * r['weight']:.2f} %), "
                f"epochs {r['epochs']} ({r['epochs_completed']} read to the end)")
    for name, r in packer.mix.report().items():
        if "dropped_at_tokens" in r:
            say(f"data: '{name}' left the mixture at {r['dropped_at_tokens']:,} tokens ({r['dropped_because']}); "
                "the other sources' weights renormalise from there")
    if packer.mix.ended_by is not None and len(packer.names) > 1:
        (i, how), cap = packer.mix.ended_by, packer.args.max_tokens
        said = f": {tr['tokens'] + va['tokens']:,} tokens of max_tokens {cap:,}" if cap else ""
        say(f"data: the mixture ended when '{packer.names[i]}' {how} (on_source_end: stop, the first "
            "source to end ends it; 'drop' lets the others go on: docs/data.md, Mixtures)"
            + said)
    say(f"data: {new:,} tokens in {dt:.1f}s = {new / max(dt, 1e-9):,.0f} tokens/s with {procs} tokenizing "
        f"process(es) ({packer.pool.encoder.backend}) = {new / max(dt, 1e-9) / procs:,.0f} tokens/s per core")
