"""The browser portal: server-rendered pages over the same selectors the API uses."""
