"""The staff home: the console's links, where the embedding model stands, and the truth
check's latest run."""

from __future__ import annotations

from flask import current_app
from flask_admin import AdminIndexView, expose

from dashboard.extensions import db
from dashboard.memory import embedder_model_name, last_verification, model_change_progress
from dashboard.staff import RoleGate


class StaffIndexView(RoleGate, AdminIndexView):
    @expose("/")
    def index(self):
        # A change of model is every user's rebuild: the home says how far it has come.
        model = embedder_model_name(current_app.config["EMBEDDER"])
        return self.render("admin/staff_index.html",
                           model_change=model_change_progress(db.session, model),
                           truth=last_verification(db.session))
