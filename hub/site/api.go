package site

import (
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
)

// Register implements route.Feature: GET /v1/sites, to whoever may list
// nodes.
func (a API) Register(rt route.Routes) {
	rt.Handle("GET /v1/sites", rt.Lister(func(w http.ResponseWriter, r *http.Request, _ route.Caller) {
		a.list(rt, w, r)
	}))
}

func (a API) list(rt route.Routes, w http.ResponseWriter, r *http.Request) {
	if a.Children == nil {
		route.JSON(w, http.StatusOK, []apitype.Site{})
		return
	}
	out, err := a.Sites(r.Context())
	if err != nil {
		rt.Error(w, r, route.Internal("list sites", err))
		return
	}
	if out == nil {
		out = []apitype.Site{}
	}
	route.JSON(w, http.StatusOK, out)
}
