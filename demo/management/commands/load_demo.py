"""Load the demo cluster, teams, people and jobs (idempotent)."""

import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from demo.seed import demo_logins, load_demo


class Command(BaseCommand):
    help = "Load the seed case-study cluster, teams, users and some jobs. Safe to run twice."

    def add_arguments(self, parser):
        parser.add_argument(
            "--history-days",
            type=int,
            default=7,
            help="days of generated past history (rollups derived from the demo's nodes and teams, with a "
            "working-day load curve) so the History and Capacity pages show something at once; 0: none. "
            "Skipped when history is already recorded.",
        )

    def handle(self, *args, history_days: int, **options):
        # The seed's jobs are made, not run: their state changes (a line each) would hide the logins below.
        jobs_log = logging.getLogger("tessera.jobs")
        level = jobs_log.level
        jobs_log.setLevel(logging.WARNING)
        try:
            load_demo(token_dir=settings.VAR_DIR / "agent-tokens", history_days=history_days)
        finally:
            jobs_log.setLevel(level)
        self.stdout.write(
            self.style.SUCCESS("Demo data loaded. Sign in at /login/ (staff also reach /admin/):")
        )
        for username, password, what in demo_logins():
            self.stdout.write(f"  {username:<6} / {password:<14} {what}")
