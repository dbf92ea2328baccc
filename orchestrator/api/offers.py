"""``gpuq offers``: what the configured providers rent now, cheapest first (docs/providers.md, "Offers").

Every provider with an API key is asked for its offers of the wanted GPU count(s); one without a key is
skipped with the sentence that says where a key goes, and one whose call fails is named with its error
while the others still list.  Filtering and order are orchestrator/money/rentplan.py's (the same rule ``gpuq up
--for`` rents by).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from orchestrator.context import Context
from orchestrator.core.errors import GpuqError, ProviderAuthError
from orchestrator.money import rentplan
from orchestrator.providers import registry
from orchestrator.providers.models import Offer, OfferQuery
from orchestrator.scheduling.gpumatch import GpuNeed
from orchestrator.tick.leases import provider_for


@dataclass
class OfferScan:
    """The offers found (filtered, cheapest first), and the providers not asked or failing, with why."""

    offers: list[Offer] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # provider -> why it was not asked (no key, no offers)
    failed: dict[str, str] = field(default_factory=dict)  # provider -> its error
    seen: int = 0  # offers the providers returned before filtering
    asked: int = 0  # providers that answered (none: "no offers match" would be a guess)


def scan_offers(ctx: Context, *, gpu_counts: Sequence[int] = (1,), models: Sequence[str] = (),
                mem_gb: float | None = None, spot: bool = False, max_price: Decimal | None = None,
                providers: Sequence[str] = ()) -> OfferScan:
    """Offers of every configured provider (``providers``: only those) with one of ``gpu_counts`` GPUs,
    matching ``models`` / ``mem_gb`` (rentplan.serves), priced for ``spot`` and at most ``max_price``
    per machine-hour when given; available ones only, cheapest first.  Each provider is asked one
    :class:`OfferQuery` per GPU count (count, memory floor, spot, price cap), which its adapter translates
    into its vendor's search or filters itself; a provider without spot is skipped, not asked, for ``spot``."""
    for name in providers:
        registry.entry(name)  # UsageError for a provider gpuq does not know
    out = OfferScan()
    found: list[Offer] = []
    for name in providers or registry.names():
        entry = registry.entry(name)
        if not entry.capabilities().offers:
            out.skipped[name] = "its adapter lists no offers"
            continue
        if spot and not entry.capabilities().spot:
            out.skipped[name] = "it rents no spot machines"
            continue
        try:
            prov = provider_for(ctx, name)
            for count in sorted(set(gpu_counts)):
                found += prov.list_offers(OfferQuery(gpu_count=count, min_gpu_memory_gb=mem_gb, spot=spot,
                                                     max_price_per_hour=max_price))
            out.asked += 1
        except ProviderAuthError as exc:
            (out.skipped if exc.code == "no-api-key" else out.failed)[name] = str(exc)
        except GpuqError as exc:
            out.failed[name] = str(exc)
    out.seen = len(found)
    need = GpuNeed(tuple(models), mem_gb)
    kept = [o for o in found if o.gpu_count in gpu_counts and rentplan.serves(o, o.gpu_count, need)
            and rentplan.price_of(o, spot) is not None]
    if max_price is not None:
        kept = [o for o in kept if (rentplan.price_of(o, spot) or Decimal(0)) <= max_price]
    out.offers = rentplan.cheapest_first(kept, spot)
    return out
