"""Issue (or rotate) a node's agent token; only its hash is stored, the token is shown once."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from scheduling.inventory.models import Node
from scheduling.inventory.services import node_issue_token


class Command(BaseCommand):
    help = "Issue a new agent token for a node (the old one stops working). Prints it, or writes it to --out."

    def add_arguments(self, parser):
        parser.add_argument("node", help="node name, as registered in the admin site")
        parser.add_argument("--out", help="write the token to this file (mode 600) instead of printing it")

    def handle(self, *args, node: str, out: str | None, **options):
        found = Node.objects.filter(name=node).first()
        if found is None:
            raise CommandError(f"no node named {node!r}; register it in the admin site first")
        token = node_issue_token(node=found)
        if out:
            path = Path(out)
            path.write_text(token)
            path.chmod(0o600)
            self.stdout.write(f"Token for {node} written to {path} (prefix {token[:12]}).")
        else:
            self.stdout.write(token)
