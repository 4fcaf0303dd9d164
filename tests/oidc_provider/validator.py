"""The provider's claims: the standard ones a site's provider sends, and `groups` (the user's group names)."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "groups": "profile",
        "preferred_username": "profile",
        "given_name": "profile",
        "family_name": "profile",
        "email": "email",
    }

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "email": user.email,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
