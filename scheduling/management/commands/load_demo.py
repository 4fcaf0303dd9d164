"""Load the demo cluster, teams, people and jobs (idempotent)."""

from django.conf import settings
from django.core.management.base import BaseCommand

from scheduling.demo import demo_logins, load_demo


class Command(BaseCommand):
    help = "Load the seed case-study cluster, teams, users and some jobs. Safe to run twice."

    def handle(self, *args, **options):
        load_demo(token_dir=settings.VAR_DIR / "agent-tokens")
        self.stdout.write(
            self.style.SUCCESS("Demo data loaded. Sign in at /login/ (staff also reach /admin/):")
        )
        for username, password, what in demo_logins():
            self.stdout.write(f"  {username:<6} / {password:<14} {what}")
