"""The replay. In: the profile database (mapping/profile.py) and results databases of the isolated
replay (`pytest benches/` on the import's configs). Out: replayed times back in the profile database
(backfill.py), the replay report (report.py), a case's time (lookup.py), and the calls replayed in
their order: plan.py builds the plan, whatif.py transforms it (--backend, --replace), sequence.py
runs it, summary.py sums it into per-phase times and the profile database."""
