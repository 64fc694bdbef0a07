"""Collage's graph-level optimizer: an evolutionary search over region backends.

Op-level costs assume that costs add up. They do not where a region backend
fuses across the DP's group boundaries. The genome has one gene per DP group
(a partition of the op-level plan): ``KEEP`` (the op-level choice) or one of
the region backends. Adjacent genes on the same region backend merge into
one region when the plan is compiled (:meth:`Plan.merged`).

* Seeds: the op-level plan, each region backend for the whole model, and
  random individuals.
* Operators: tournament selection over the measured archive, uniform
  crossover, per-gene mutation.
* Each generation, every new individual gets a cheap estimate (``estimate``:
  the sum of known candidate costs plus boundary costs); only the
  ``measure_per_generation`` best estimates are measured end to end
  (``fitness``). Fitness is memoised by the compiled plan's canonical form,
  so a plan is never measured twice.
* The search stops after ``generations`` or ``budget_seconds``. With a
  deterministic fitness, the same seed gives the same sequence of individuals.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from collage_ml.ir.graph import Graph
from collage_ml.plan import Partition, Plan

KEEP = "keep"


@dataclass
class EvoConfig:
    population: int = 12
    generations: int = 6
    budget_seconds: float = 300.0
    measure_per_generation: int = 3
    random_seeds: int = 4
    mutation_rate: float = 0.25
    tournament: int = 3
    seed: int = 0
    force_seeds: bool = True  # measure every single-backend seed (exhaustive); guided mode lets the estimate decide


@dataclass
class Evaluated:
    genome: tuple[str, ...]
    plan: Plan
    seconds: float | None  # measured end-to-end latency; None = invalid
    error: str = ""
    generation: int = 0


@dataclass
class EvoResult:
    best: Evaluated | None
    generations: int
    e2e_measurements: int
    evaluated: list[Evaluated] = field(default_factory=list)
    proposed: list[tuple[str, ...]] = field(default_factory=list)  # every genome proposed, in order
    seconds: float = 0.0


class GraphLevelSearch:
    """Evolves region-backend assignments of the op-level plan's groups.

    ``fitness(plan) -> (seconds | None, error_text)`` measures a plan end to
    end; ``estimate(plan) -> seconds`` is the cheap predictor that decides
    which individuals get measured.
    """

    def __init__(
        self,
        graph: Graph,
        op_plan: Plan,
        region_backends: Sequence[str],
        fitness: Callable[[Plan], tuple[float | None, str]],
        estimate: Callable[[Plan], float],
        config: EvoConfig = EvoConfig(),
        known: dict[tuple, tuple[float | None, str]] | None = None,
        specs: dict[str, tuple] | None = None,
        worth: Callable[[float, float | None], bool] | None = None,
    ):
        self.graph = graph
        self.groups = op_plan.partitions
        self.op_plan = op_plan
        self.alleles = (KEEP,) + tuple(region_backends)
        self.region = set(region_backends)
        self.fitness = fitness
        self.estimate = estimate
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.memo: dict[tuple, tuple[float | None, str]] = dict(known or {})
        self.specs = {p.backend: p.backend_spec for p in op_plan.partitions}
        self.specs.update(specs or {})
        self.measured = 0
        self.worth = worth  # worth(estimate, best measured so far) -> measure this individual?
        self.skipped = 0

    # -- genome <-> plan ----------------------------------------------------------------
    def plan_of(self, genome: Sequence[str]) -> Plan:
        if genome and genome[0] != KEEP and len(set(genome)) == 1:
            b = genome[0]
            return Plan(self.op_plan.model, [Partition(b, list(range(len(self.graph))), backend_spec=self.specs.get(b))],
                        self.op_plan.hardware, self.op_plan.threads, dict(self.op_plan.versions),
                        graph_hash=self.op_plan.graph_hash)
        parts = []
        for g, gene in zip(self.groups, genome):
            backend = g.backend if gene == KEEP else gene
            parts.append(Partition(backend, list(g.nodes), backend_spec=self.specs.get(backend)))
        plan = Plan(self.op_plan.model, parts, self.op_plan.hardware, self.op_plan.threads,
                    dict(self.op_plan.versions), graph_hash=self.op_plan.graph_hash)
        return plan.merged(self.graph, self.region | {g.backend for g in self.groups if g.backend in self.region})

    def _random_genome(self) -> tuple[str, ...]:
        return tuple(self.rng.choice(self.alleles) for _ in self.groups)

    def _mutate(self, genome: tuple[str, ...]) -> tuple[str, ...]:
        out = list(genome)
        for i in range(len(out)):
            if self.rng.random() < self.cfg.mutation_rate:
                out[i] = self.rng.choice(self.alleles)
        # a run of neighbours flipped together lets fused regions appear in one step
        if len(out) > 1 and self.rng.random() < 0.5:
            i = self.rng.randrange(len(out))
            j = min(len(out), i + self.rng.randint(2, max(2, len(out) // 2)))
            gene = self.rng.choice(self.alleles)
            for k in range(i, j):
                out[k] = gene
        return tuple(out)

    def _crossover(self, a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(x if self.rng.random() < 0.5 else y for x, y in zip(a, b))

    def _tournament(self, pool: list[Evaluated]) -> Evaluated:
        picks = [pool[self.rng.randrange(len(pool))] for _ in range(min(self.cfg.tournament, len(pool)))]
        return min(picks, key=lambda e: e.seconds if e.seconds is not None else float("inf"))

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> EvoResult:
        t0 = time.perf_counter()
        n = len(self.groups)
        seeds = [tuple([KEEP] * n)] + [tuple([b] * n) for b in self.alleles[1:]]
        seeds += [self._random_genome() for _ in range(self.cfg.random_seeds)]
        archive: list[Evaluated] = []
        proposed: list[tuple[str, ...]] = []
        gen = 0
        # generation 0: the seeds (the op-level and single-backend plans are always measured)
        self._evaluate(seeds, archive, proposed, gen, must=len(self.alleles) if self.cfg.force_seeds else 1)
        while gen < self.cfg.generations and time.perf_counter() - t0 < self.cfg.budget_seconds:
            gen += 1
            pool = [e for e in archive if e.seconds is not None] or archive
            if not pool:
                break
            children = []
            for _ in range(self.cfg.population):
                a, b = self._tournament(pool), self._tournament(pool)
                children.append(self._mutate(self._crossover(a.genome, b.genome)))
            self._evaluate(children, archive, proposed, gen, must=0)
        valid = [e for e in archive if e.seconds is not None]
        best = min(valid, key=lambda e: e.seconds) if valid else None
        return EvoResult(best, gen, self.measured, archive, proposed, time.perf_counter() - t0)

    def _evaluate(self, genomes, archive, proposed, gen: int, must: int) -> None:
        """Measures the ``must`` first genomes and the best-estimated new ones, up to the per-generation cap."""
        fresh: dict[tuple, tuple[tuple[str, ...], Plan]] = {}
        for i, g in enumerate(genomes):
            proposed.append(g)
            plan = self.plan_of(g)
            canon = plan.canonical()
            if canon in fresh:
                continue
            if canon in self.memo:
                # known already: it joins the archive without a new measurement
                if not any(e.plan.canonical() == canon for e in archive):
                    secs, err = self.memo[canon]
                    archive.append(Evaluated(g, plan, secs, err, gen))
                continue
            fresh[canon] = (g, plan)
        items = list(fresh.items())
        forced = [it for it in items if it[1][0] in genomes[:must]]
        rest = [it for it in items if it not in forced]
        est = {canon: self.estimate(plan) for canon, (_, plan) in rest}
        rest.sort(key=lambda it: (est[it[0]], it[0]))
        if self.worth is not None:
            done = [e.seconds for e in archive if e.seconds is not None]
            best = min(done) if done else None
            keep = [it for it in rest if self.worth(est[it[0]], best)]
            self.skipped += len(rest) - len(keep)
            rest = keep
        chosen = forced + rest[: self.cfg.measure_per_generation]
        for canon, (g, plan) in chosen:
            secs, err = self.fitness(plan)
            self.measured += 1
            self.memo[canon] = (secs, err)
            archive.append(Evaluated(g, plan, secs, err, gen))
