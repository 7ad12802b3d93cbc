package operator

import (
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/pki"
)

// Register serves `tether login` (a challenge, then the signed answer) and
// `tether ca revoke-admin`. The login endpoints take no credential: the
// signature over the challenge is the credential.
func (s *Service) Register(rt route.Routes) {
	rt.Handle("POST /v1/login/challenge", func(w http.ResponseWriter, r *http.Request) {
		var req apitype.LoginChallengeRequest
		if !route.Decode(w, r, &req, route.MaxBody) {
			return
		}
		if err := pki.ValidateName(req.Operator); err != nil {
			rt.Error(w, r, route.Fail(apitype.ErrInvalid, "operator %s", err.Error()))
			return
		}
		nonce, exp, err := s.Challenge(r.Context(), req.Operator, r.RemoteAddr)
		if err != nil {
			rt.Error(w, r, err)
			return
		}
		route.JSON(w, http.StatusOK, apitype.LoginChallengeResponse{Nonce: nonce, ExpiresAt: exp})
	})
	rt.Handle("POST /v1/login", func(w http.ResponseWriter, r *http.Request) {
		var req apitype.LoginRequest
		if !route.Decode(w, r, &req, route.MaxBody) {
			return
		}
		resp, err := s.Login(r.Context(), req, r.RemoteAddr)
		if err != nil {
			rt.Error(w, r, err)
			return
		}
		route.JSON(w, http.StatusOK, resp)
	})
	rt.Handle("POST /v1/ca/revoke-admin", rt.Admin(func(w http.ResponseWriter, r *http.Request) {
		t, err := s.RevokeAdmin(r.Context(), route.AdminName(r), r.RemoteAddr)
		if err != nil {
			route.JSON(w, http.StatusInternalServerError,
				apitype.ErrorResponse{Error: "revoke admin certificates: " + err.Error()})
			return
		}
		route.JSON(w, http.StatusOK, apitype.RevokeAdminResponse{ValidFrom: t})
	}))
}
