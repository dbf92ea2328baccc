"""``gpuq offers`` and the ``--for QUEUE`` form of ``gpuq up``: what the providers rent now, and renting
what a queue needs from the cheapest of it (docs/providers.md, "Offers" and "Renting for a queue")."""

from __future__ import annotations

import json
import re
import sys
from decimal import Decimal

import click

from orchestrator.cli.ctx import echo, open_ctx
from orchestrator.cli.flags import number
from orchestrator.core import exitcodes
from orchestrator.core.errors import UsageError


@click.command()
@click.option("--gpu", "models", multiple=True, metavar="MODEL",
              help="Only these GPU models (repeat, or join with |), by the queue's gpu= rule: A100 matches "
                   '"A100 SXM4", not "A10".')
@click.option("--gpu-mem", "gpu_mem", metavar="GB",
              help="Only GPUs with at least this many GB of memory each (as sold: 80 for an 80 GB card).")
@click.option("--gpus", "gpus", default="1", show_default=True, metavar="N", help="GPUs per machine.")
@click.option("--spot", is_flag=True, help="Spot (interruptible) prices: the current minimum bid per machine.")
@click.option("--max-price", "max_price", metavar="USD", help="Only machines at most this many dollars per hour.")
@click.option("--provider", "providers", multiple=True, metavar="NAME", help="Only this provider (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (docs/schemas/offers.schema.json).")
def offers(models: tuple[str, ...], gpu_mem: str | None, gpus: str, spot: bool, max_price: str | None,
           providers: tuple[str, ...], as_json: bool) -> None:
    """List what the configured providers (those with an API key) rent now, cheapest machine first,
    with the price per GPU too.  A provider without a key is named as skipped, one whose call fails with
    its error; the others still list.  Exit 1 when a provider failed."""
    from orchestrator.api.offers import scan_offers
    from orchestrator.providers import registry

    count = number("--gpus", gpus, most=64)
    if count is None or count != int(count):
        raise UsageError(f"--gpus {gpus!r}: give a whole number of GPUs")
    wanted = tuple(m for text in models for m in text.split("|") if m)
    if any(not re.fullmatch(r"[A-Za-z0-9._-]*[A-Za-z0-9][A-Za-z0-9._-]*", m) for m in wanted):
        raise UsageError(f"--gpu {' '.join(models)!r}: a model is letters, digits, '.', '_' and '-'")
    for name in providers:
        registry.entry(name)
    cap = number("--max-price", max_price)
    scan = scan_offers(open_ctx(), gpu_counts=(int(count),), models=wanted, mem_gb=number("--gpu-mem", gpu_mem,
                       most=4096), spot=spot, max_price=Decimal(str(cap)) if cap is not None else None,
                       providers=providers)
    if as_json:
        _offers_json(scan, spot)
    else:
        _offers_text(scan, spot)
    if scan.failed:
        sys.exit(exitcodes.FAILED)
    if not scan.asked:  # every provider skipped (no API key anywhere): nothing was looked at
        echo("gpuq: no provider was asked (none has an API key or lists offers): nothing to list; "
             "docs/providers.md says where a key goes", err=True)
        sys.exit(exitcodes.FAILED)


def _offers_text(scan: object, spot: bool) -> None:
    from orchestrator.api.offers import OfferScan
    from orchestrator.money import rentplan

    assert isinstance(scan, OfferScan)
    for name, why in scan.skipped.items():
        echo(f"gpuq: {name} skipped: {why}", err=True)
    for name, why in scan.failed.items():
        echo(f"gpuq: {name} failed: {why}", err=True)
    if not scan.offers:
        if scan.asked:  # else nothing was looked at: offers() says so
            echo(f"no offers match ({scan.seen} seen before filtering)")
        return
    rows = []
    for offer in scan.offers:
        price = rentplan.price_of(offer, spot)
        each = rentplan.per_gpu(offer, spot)
        rows.append([offer.provider, offer.gpu_type, str(offer.gpu_count),
                     f"{offer.gpu_memory_gb} GB" if offer.gpu_memory_gb is not None else "-",
                     f"${price:.2f}" if price is not None else "-", f"${each:.3f}" if each is not None else "-",
                     ",".join(offer.regions) or "-", offer.display_name])
    headers = ["PROVIDER", "GPU TYPE (--gpu)", "GPUS", "MEM/GPU", "SPOT $/H" if spot else "$/H", "$/GPU-H", "REGIONS",
               "OFFER"]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _offers_json(scan: object, spot: bool) -> None:
    from orchestrator.api.offers import OfferScan
    from orchestrator.cli.offers_document import OfferEntry, OffersDocument
    from orchestrator.money import rentplan

    assert isinstance(scan, OfferScan)
    entries = []
    for offer in scan.offers:
        price, each = rentplan.price_of(offer, spot), rentplan.per_gpu(offer, spot)
        assert price is not None  # scan_offers keeps priced offers only
        entries.append(OfferEntry(provider=offer.provider, gpu_type=offer.gpu_type, name=offer.display_name,
                                  gpus=offer.gpu_count, gpu_memory_gb=offer.gpu_memory_gb,
                                  price_per_hour=float(price), price_per_gpu_hour=float(each) if each is not None
                                  else None, spot=spot, regions=list(offer.regions)))
    doc = OffersDocument(schema_="gpuq.cli.offers/1", offers=entries, skipped=scan.skipped, failed=scan.failed)
    click.echo(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2, sort_keys=True))
